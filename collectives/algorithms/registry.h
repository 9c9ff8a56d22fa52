// The algorithm registry. Every algorithm is one file in this folder and one
// row of the table in registry.cc, in the manner of UCC's
// ucc_tl_ucp_allreduce_algs[]: its id, name and aliases, the collectives it
// implements (one program builder each), the scratch memory it needs and its
// cost in the alpha-beta-gamma model. Parsing and naming (types.h), the
// communicator's checks, the cost model's choice, the tests and the bench all
// read this table, so nothing else lists algorithms.
//
// A builder emits one rank's Program in the vocabulary of program.h. It only
// decides who sends which elements to whom at which step; the executor moves
// and reduces the bytes.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/program.h"
#include "collectives/topology.h"
#include "collectives/types.h"
#include "common/status.h"

namespace rdmaflow {

// One call's arguments, as the algorithms see them. `count` follows the NCCL
// convention of each operation:
//   allreduce, broadcast, reduce: elements in the buffer
//   reduce_scatter: elements each rank receives (in holds world * count)
//   allgather: elements each rank contributes (out holds world * count)
//   alltoall: elements sent to each peer (in and out hold world * count)
// `tmp` is communicator-owned local memory of temp_elems() elements.
struct CollArgs {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::byte* tmp = nullptr;
  size_t count = 0;
  DataType type = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int rank = 0;
  int world = 1;
  // The communicator's host groups and cost model (null: one host, the
  // default costs): what a hierarchical algorithm builds and chooses its
  // phases with.
  const HostGroups* hosts = nullptr;
  const CostModel* model = nullptr;

  size_t es() const { return dtype_size(type); }
  const std::byte* in_at(size_t elem) const { return in + elem * es(); }
  std::byte* out_at(size_t elem) const { return out + elem * es(); }
  std::byte* tmp_at(size_t elem) const { return tmp + elem * es(); }
};

// Emits one rank's program of one collective (not finalized).
using BuildFn = void (*)(const CollArgs& a, Program& p);
// One builder per collective kind, indexed by the kind; null where the
// algorithm does not implement it.
using Builders = std::array<BuildFn, std::size(kAllCollectives)>;

constexpr Builders builders(std::initializer_list<std::pair<CollectiveKind, BuildFn>> impls) {
  Builders out{};
  for (const auto& [kind, fn] : impls) out[static_cast<size_t>(kind)] = fn;
  return out;
}

struct AlgorithmInfo {
  Algorithm id;
  // What algorithm_name() returns; parse_algorithm() (so RDMAFLOW_<OP>_ALGO
  // and CallOptions from strings) takes it and the aliases.
  std::string_view name;
  std::array<std::string_view, 2> aliases;
  Builders build;
  // Elements of CollArgs::tmp a call needs; null when it needs none.
  size_t (*scratch)(const CollArgs& a);
  // Dependent rounds: a rank waits for a partner once per round.
  double (*rounds)(CollectiveKind kind, const CostTerms& t);
  // Seconds on the wire and in reductions for a call of t.m bytes, for the
  // kinds it implements.
  double (*cost)(CollectiveKind kind, const CostTerms& t);
  // Every rank's sends for a call of t.m bytes (CostModel::crowded), for the
  // kinds it says; null, or nothing sent, where it does not (the model then
  // costs the rounds even on crowded CPUs).
  Work (*work)(CollectiveKind kind, const CostTerms& t) = nullptr;

  bool implements(CollectiveKind kind) const { return build[static_cast<size_t>(kind)] != nullptr; }
};

// Every algorithm, in the order of the Algorithm enum (kAuto, the cost model's
// choice, has no row). The cost model tries them in this order, so of equal
// estimates the earlier row wins.
std::span<const AlgorithmInfo> algorithm_table();

// The row of `algo`; null for kAuto.
const AlgorithmInfo* find_algorithm(Algorithm algo);

struct KindAlgorithm {
  CollectiveKind kind;
  Algorithm algo;
};
// Every (collective, algorithm) the table implements: kinds in kAllCollectives
// order, algorithms in table order. Tests and benches iterate this.
std::vector<KindAlgorithm> supported_pairs();

// Elements of local temporary memory `algo` needs for `args`.
size_t temp_elems(const CollArgs& args, Algorithm algo);

// Emits the program of `algo` for `args` (not finalized). kInvalidArgument when
// the algorithm does not implement the collective.
Status build_program(const CollArgs& args, Algorithm algo, Program& program);

// Emits the program of `sub`, a collective among `ranks` (this rank is
// ranks[sub.rank], sub.world == ranks.size()), by `algo` or by `build`; the
// peers it names are mapped to the real ranks (Program::Group). The phases of
// a hierarchical algorithm are such sub-collectives (one within a host, one
// between hosts). The sub-collective sees its ranks as one host.
Status build_in_group(const CollArgs& sub, Algorithm algo, std::span<const int> ranks,
                      Program& program);
void build_in_group(const CollArgs& sub, BuildFn build, std::span<const int> ranks,
                    Program& program);

}  // namespace rdmaflow
