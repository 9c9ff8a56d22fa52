#include "collectives/algorithms/registry.h"

#include <string>

namespace rdmaflow {

// What each algorithm's file (this folder) defines for its row of the table.
// ring.cc
void ring_allreduce(const CollArgs& a, Program& p);
void ring_reduce_scatter(const CollArgs& a, Program& p);
void ring_allgather(const CollArgs& a, Program& p);
void ring_broadcast(const CollArgs& a, Program& p);  // pipelined chain
void ring_reduce(const CollArgs& a, Program& p);     // ring reduce-scatter + gather to root
size_t ring_scratch(const CollArgs& a);
double ring_rounds(CollectiveKind kind, const CostTerms& t);
double ring_cost(CollectiveKind kind, const CostTerms& t);
Work ring_work(CollectiveKind kind, const CostTerms& t);
// binomial_tree.cc
void tree_allreduce(const CollArgs& a, Program& p);  // binomial reduce to 0 + broadcast
void tree_broadcast(const CollArgs& a, Program& p);
void tree_reduce(const CollArgs& a, Program& p);
void tree_barrier(const CollArgs& a, Program& p);
size_t tree_scratch(const CollArgs& a);
double tree_rounds(CollectiveKind kind, const CostTerms& t);
double tree_cost(CollectiveKind kind, const CostTerms& t);
Work tree_work(CollectiveKind kind, const CostTerms& t);
// double_binary_tree.cc
void dbtree_allreduce(const CollArgs& a, Program& p);
double dbtree_rounds(CollectiveKind kind, const CostTerms& t);
double dbtree_cost(CollectiveKind kind, const CostTerms& t);
Work dbtree_work(CollectiveKind kind, const CostTerms& t);
// rabenseifner.cc
void rabenseifner_allreduce(const CollArgs& a, Program& p);
void rabenseifner_reduce_scatter(const CollArgs& a, Program& p);
void rabenseifner_reduce(const CollArgs& a, Program& p);
size_t rabenseifner_scratch(const CollArgs& a);
double rabenseifner_rounds(CollectiveKind kind, const CostTerms& t);
double rabenseifner_cost(CollectiveKind kind, const CostTerms& t);
Work rabenseifner_work(CollectiveKind kind, const CostTerms& t);
// recursive_doubling.cc
void rd_allreduce(const CollArgs& a, Program& p);
void rd_reduce_scatter(const CollArgs& a, Program& p);
void rd_allgather(const CollArgs& a, Program& p);
size_t rd_scratch(const CollArgs& a);
double rd_rounds(CollectiveKind kind, const CostTerms& t);
double rd_cost(CollectiveKind kind, const CostTerms& t);
Work rd_work(CollectiveKind kind, const CostTerms& t);
// pairwise.cc
void pairwise_alltoall(const CollArgs& a, Program& p);
size_t pairwise_scratch(const CollArgs& a);
double pairwise_rounds(CollectiveKind kind, const CostTerms& t);
double pairwise_cost(CollectiveKind kind, const CostTerms& t);
// dissemination.cc
void dissemination_barrier(const CollArgs& a, Program& p);
size_t dissemination_scratch(const CollArgs& a);
double dissemination_rounds(CollectiveKind kind, const CostTerms& t);
double dissemination_cost(CollectiveKind kind, const CostTerms& t);
// direct.cc
void direct_allreduce(const CollArgs& a, Program& p);
void direct_allgather(const CollArgs& a, Program& p);
size_t direct_scratch(const CollArgs& a);
double direct_rounds(CollectiveKind kind, const CostTerms& t);
double direct_cost(CollectiveKind kind, const CostTerms& t);
Work direct_work(CollectiveKind kind, const CostTerms& t);
// hier.cc
void hier_allreduce(const CollArgs& a, Program& p);
// hier_ops.cc
void hier_reduce_scatter(const CollArgs& a, Program& p);
void hier_allgather(const CollArgs& a, Program& p);
void hier_broadcast(const CollArgs& a, Program& p);
void hier_reduce(const CollArgs& a, Program& p);
void hier_barrier(const CollArgs& a, Program& p);
size_t hier_scratch(const CollArgs& a);
double hier_rounds(CollectiveKind kind, const CostTerms& t);
double hier_cost(CollectiveKind kind, const CostTerms& t);
Work hier_work(CollectiveKind kind, const CostTerms& t);

namespace {

using K = CollectiveKind;
using A = Algorithm;

// clang-format off
constexpr AlgorithmInfo kTable[] = {
    {A::kRing, "ring", {},
     builders({{K::kAllreduce, ring_allreduce}, {K::kReduceScatter, ring_reduce_scatter},
               {K::kAllgather, ring_allgather}, {K::kBroadcast, ring_broadcast},
               {K::kReduce, ring_reduce}}),
     ring_scratch, ring_rounds, ring_cost, ring_work},
    {A::kTree, "tree", {"binomial", "binomial_tree"},
     builders({{K::kAllreduce, tree_allreduce}, {K::kBroadcast, tree_broadcast},
               {K::kReduce, tree_reduce}, {K::kBarrier, tree_barrier}}),
     tree_scratch, tree_rounds, tree_cost, tree_work},
    {A::kDoubleBinaryTree, "dbtree", {"double_binary_tree", "double_tree"},
     builders({{K::kAllreduce, dbtree_allreduce}}),
     nullptr, dbtree_rounds, dbtree_cost, dbtree_work},
    {A::kRabenseifner, "rabenseifner", {"halving_doubling", "rhd"},
     builders({{K::kAllreduce, rabenseifner_allreduce},
               {K::kReduceScatter, rabenseifner_reduce_scatter},
               {K::kReduce, rabenseifner_reduce}}),
     rabenseifner_scratch, rabenseifner_rounds, rabenseifner_cost, rabenseifner_work},
    {A::kRecursiveDoubling, "rd", {"recursive_doubling"},
     builders({{K::kAllreduce, rd_allreduce}, {K::kReduceScatter, rd_reduce_scatter},
               {K::kAllgather, rd_allgather}}),
     rd_scratch, rd_rounds, rd_cost, rd_work},
    {A::kPairwise, "pairwise", {},
     builders({{K::kAlltoall, pairwise_alltoall}}),
     pairwise_scratch, pairwise_rounds, pairwise_cost},
    {A::kDissemination, "dissemination", {},
     builders({{K::kBarrier, dissemination_barrier}}),
     dissemination_scratch, dissemination_rounds, dissemination_cost},
    {A::kDirect, "direct", {},
     builders({{K::kAllreduce, direct_allreduce}, {K::kAllgather, direct_allgather}}),
     direct_scratch, direct_rounds, direct_cost, direct_work},
    {A::kHier, "hier", {"hierarchical"},
     builders({{K::kAllreduce, hier_allreduce}, {K::kReduceScatter, hier_reduce_scatter},
               {K::kAllgather, hier_allgather}, {K::kBroadcast, hier_broadcast},
               {K::kReduce, hier_reduce}, {K::kBarrier, hier_barrier}}),
     hier_scratch, hier_rounds, hier_cost, hier_work},
};
// clang-format on

// Row i is Algorithm i + 1, so a lookup is an index.
constexpr bool in_enum_order() {
  for (size_t i = 0; i < std::size(kTable); ++i) {
    if (static_cast<size_t>(kTable[i].id) != i + 1) return false;
  }
  return true;
}
static_assert(in_enum_order(), "kTable rows must follow the Algorithm enum, after kAuto");

}  // namespace

std::span<const AlgorithmInfo> algorithm_table() {
  return kTable;
}

const AlgorithmInfo* find_algorithm(Algorithm algo) {
  const size_t i = static_cast<size_t>(algo);
  return i >= 1 && i <= std::size(kTable) ? &kTable[i - 1] : nullptr;
}

std::vector<KindAlgorithm> supported_pairs() {
  std::vector<KindAlgorithm> out;
  for (CollectiveKind kind : kAllCollectives) {
    for (const AlgorithmInfo& info : kTable) {
      if (info.implements(kind)) out.push_back({kind, info.id});
    }
  }
  return out;
}

size_t temp_elems(const CollArgs& a, Algorithm algo) {
  const AlgorithmInfo* info = find_algorithm(algo);
  return info && info->scratch ? info->scratch(a) : 0;
}

Status build_program(const CollArgs& a, Algorithm algo, Program& p) {
  const AlgorithmInfo* info = find_algorithm(algo);
  if (info && info->implements(a.kind)) {
    info->build[static_cast<size_t>(a.kind)](a, p);
    return Status::ok();
  }
  return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(collective_name(a.kind)), -1,
                        "algorithm '" + std::string(algorithm_name(algo)) +
                            "' does not implement " + std::string(collective_name(a.kind)));
}

Status build_in_group(const CollArgs& sub, Algorithm algo, std::span<const int> ranks, Program& p) {
  CollArgs a = sub;
  a.hosts = nullptr;
  Program::Group group(p, ranks);
  return build_program(a, algo, p);
}

void build_in_group(const CollArgs& sub, BuildFn build, std::span<const int> ranks, Program& p) {
  CollArgs a = sub;
  a.hosts = nullptr;
  Program::Group group(p, ranks);
  build(a, p);
}

// The names and checks of types.h, answered by the table.

std::string_view algorithm_name(Algorithm algo) {
  if (algo == Algorithm::kAuto) return "auto";
  const AlgorithmInfo* info = find_algorithm(algo);
  return info ? info->name : "?";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) {
  if (name == "auto") return Algorithm::kAuto;
  for (const AlgorithmInfo& info : kTable) {
    if (info.name == name) return info.id;
  }
  for (const AlgorithmInfo& info : kTable) {
    for (std::string_view alias : info.aliases) {
      if (!alias.empty() && alias == name) return info.id;
    }
  }
  return std::nullopt;
}

bool algorithm_supports(Algorithm algo, CollectiveKind kind) {
  if (algo == Algorithm::kAuto) return true;
  const AlgorithmInfo* info = find_algorithm(algo);
  return info && info->implements(kind);
}

}  // namespace rdmaflow
