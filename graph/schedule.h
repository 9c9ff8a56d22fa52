// Execution order: per rank, the local ops (Send and Recv included) in the
// order the executor runs them within one step.
//
// All ranks' orders come from one global topological order of the partitioned
// graph (the Send -> Recv edges included), so together with the data edges they
// never wait on each other in a cycle. The order follows the file wherever the
// edges allow; a Send runs as soon as its input exists (so the write starts
// early) and a Recv is placed right before the first op that reads its tensor
// (it only waits for the notify).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "graph/partition.h"

namespace rdmaflow::graph {

struct Schedule {
  // order[r]: local op ids of rank r in execution order.
  std::vector<std::vector<OpId>> order;
  // position[r][op]: index of local op `op` in order[r].
  std::vector<std::vector<int32_t>> position;
  // All ops of all ranks as (rank, local op), in one global topological order
  // consistent with every order[r].
  std::vector<std::pair<int32_t, OpId>> global;
};

Result<Schedule> make_schedule(const PartitionedGraph& pg);

}  // namespace rdmaflow::graph
