// Schedules that algorithms compose, beside the ones of the registry's rows.
// They take a CollArgs like a builder (rank a.rank of a.world) and are meant
// to run inside a group (build_in_group, registry.h).
#pragma once

#include "collectives/algorithms/registry.h"

namespace rdmaflow {

// ring.cc: the two halves of the ring allreduce over a.count elements cut
// into a.world blocks (block_range). The reduce-scatter leaves block a.rank,
// reduced over every rank, in a.out (the other blocks of out hold partial
// sums; a.in may equal a.out); it does not scale kAvg. The allgather passes
// every rank's block a.rank of a.out to every other rank.
void ring_reduce_scatter_blocks(const CollArgs& a, Program& p);
void ring_allgather_blocks(const CollArgs& a, Program& p);

// hier.cc: the algorithm of hier's lane phase of `kind` for a lane's call of
// `bytes`: the cost model's choice on the link the host's lanes share (ring
// without a model or where the choice does not implement `kind`).
Algorithm lane_algorithm(const CollArgs& a, CollectiveKind kind, size_t bytes);
// hier_ops.cc: hier's scratch for every kind but allreduce.
size_t hier_ops_scratch(const CollArgs& a);

// alltoallv.cc: the pairwise alltoall with a count and a displacement (in
// elements) per peer: at step s, rank r sends its block for r + s and
// receives the block of r - s; empty blocks are no message at all (which is
// what makes gather and scatter out of it cost one message per non-root rank).
struct AlltoallvBlocks {
  const size_t* send_counts;
  const size_t* send_displs;
  const size_t* recv_counts;
  const size_t* recv_displs;
};
void pairwise_alltoallv(const CollArgs& a, const AlltoallvBlocks& blocks, Program& p);

}  // namespace rdmaflow
