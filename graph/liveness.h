// Liveness of registered buffers within one step, across ranks.
//
// Two kinds of registered buffers exist on a rank:
//  - an output buffer: a tensor produced here and sent to other ranks; the
//    producer writes it, local readers and the outgoing writes read it;
//  - a receive slot: a tensor written here by another rank's Send; local
//    readers read it.
// A buffer's life is a half-open interval [begin, end) of positions in its
// rank's schedule. Two buffers of one rank whose intervals do not overlap may
// share memory: the memory of the first is no longer touched before the second
// is first written, whichever rank does the writing. For remote writes and
// reads this is established through happens-before (data edges, Send -> Recv
// edges and each rank's sequential order), tracked with vector clocks:
//  - a receive slot begins at the last op of its rank that happens before the
//    remote Send (-1 when there is none: the write may land at any time);
//  - an output buffer ends at the first op of its rank that happens after
//    every destination's Recv completed (the write has read the buffer by
//    then), or at the end of the step when there is none.
// docs/graph-plans.md gives the argument and the executor contract it needs.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/partition.h"
#include "graph/schedule.h"

namespace rdmaflow::graph {

enum class BufferKind : uint8_t { kOutput, kSlot };

struct BufferLife {
  BufferKind kind = BufferKind::kOutput;
  TensorId tensor = 0;      // original graph id
  TransferId transfer = 0;  // kSlot: its transfer; kOutput: the first transfer of the tensor
  int32_t begin = 0;        // may be -1 (live before the first op)
  int32_t end = 0;          // exclusive; at most the rank's op count
};

struct RankLiveness {
  int32_t num_positions = 0;  // ops in the rank's schedule
  // Output buffers in tensor order, then receive slots in transfer order.
  std::vector<BufferLife> buffers;
};

std::vector<RankLiveness> cross_rank_liveness(const PartitionedGraph& pg, const Schedule& s);

// Whether two intervals share a position.
inline bool overlaps(const BufferLife& a, const BufferLife& b) {
  return a.begin < b.end && b.begin < a.end;
}

}  // namespace rdmaflow::graph
