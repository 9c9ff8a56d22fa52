// The algorithms, one per file, each emitting one rank's Program in the
// vocabulary of program.h. They only decide who sends which elements to whom
// at which step; the executor moves and reduces the bytes.
#pragma once

#include <cstddef>

#include "allocator/status.h"
#include "collectives/program.h"
#include "collectives/types.h"

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

  size_t es() const { return dtype_size(type); }
  const std::byte* in_at(size_t elem) const { return in + elem * es(); }
  std::byte* out_at(size_t elem) const { return out + elem * es(); }
  std::byte* tmp_at(size_t elem) const { return tmp + elem * es(); }
};

// Elements of local temporary memory `algo` needs for `args`.
size_t temp_elems(const CollArgs& args, Algorithm algo);

// Emits the program of `algo` for `args` (not finalized). kInvalidArgument when
// the algorithm does not implement the collective.
Status build_program(const CollArgs& args, Algorithm algo, Program& program);

// ---- one function per algorithm and collective (ring.cc, binomial_tree.cc, ...) ----
void ring_allreduce(const CollArgs& a, Program& p);
void ring_reduce_scatter(const CollArgs& a, Program& p);
void ring_allgather(const CollArgs& a, Program& p);
void ring_broadcast(const CollArgs& a, Program& p);  // pipelined chain
void ring_reduce(const CollArgs& a, Program& p);     // ring reduce-scatter + gather to root

void tree_allreduce(const CollArgs& a, Program& p);  // binomial reduce to 0 + broadcast
void tree_broadcast(const CollArgs& a, Program& p);
void tree_reduce(const CollArgs& a, Program& p);
void tree_barrier(const CollArgs& a, Program& p);

void dbtree_allreduce(const CollArgs& a, Program& p);

void rabenseifner_allreduce(const CollArgs& a, Program& p);
void rabenseifner_reduce_scatter(const CollArgs& a, Program& p);
void rabenseifner_reduce(const CollArgs& a, Program& p);

void rd_allreduce(const CollArgs& a, Program& p);
void rd_allgather(const CollArgs& a, Program& p);
void rd_reduce_scatter(const CollArgs& a, Program& p);

void direct_allgather(const CollArgs& a, Program& p);
void direct_allreduce(const CollArgs& a, Program& p);  // direct.cc
void pairwise_alltoall(const CollArgs& a, Program& p);
void dissemination_barrier(const CollArgs& a, Program& p);

}  // namespace rdmaflow
