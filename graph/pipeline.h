// The pipeline partitioner: a placement that cuts a model into N consecutive
// stages (one per rank) for pipeline parallelism (docs/graph-plans.md,
// "Pipeline stages").
//
// The ops with inputs are taken in the deterministic topological order and cut
// into N contiguous runs. Each cut k is placed where the compute before it
// (graph/cost.h) is close to k/N of the total: among the positions within
// `tolerance` x (total / N) of that target, the one where the fewest bytes
// cross (every tensor produced before the cut and read after it), ties going
// to the position closest to the target; when no position is that close (one
// op larger than the window), the closest one. Stages are contiguous in a
// topological order, so tensors only flow from a stage to a later one.
//
// Ops without inputs (weights, graph inputs, constants) are not cut: each
// goes to the first stage that reads its output, so a weight lives with its
// consumers and is never sent in a step. A weight read on more than one stage
// is listed in `shared_weights` (its later stages receive it every step, as
// the plan shows).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "graph/ir.h"
#include "graph/placement.h"

namespace rdmaflow::graph {

struct PipelineOptions {
  // How far from its target a cut may move to cross fewer bytes, as a fraction
  // of one stage's share of the compute.
  double tolerance = 0.1;
  // Bytes counted for a dynamic tensor without a size hint (PlanOptions'
  // dynamic_size_hint).
  uint64_t dynamic_hint = 64 << 10;
};

struct PipelinePartition {
  Placement placement;
  std::vector<double> stage_cost;        // estimated FLOPs per stage
  std::vector<size_t> stage_ops;         // ops per stage (weights and inputs included)
  std::vector<uint64_t> cut_bytes;       // bytes crossing each of the N-1 cuts
  std::vector<TensorId> shared_weights;  // Variable outputs read on more than one stage
};

// Fails on a cyclic graph, stages < 1, or a tolerance outside [0, 1].
Result<PipelinePartition> pipeline_partition(const Graph& g, int stages,
                                             const PipelineOptions& options = {});

}  // namespace rdmaflow::graph
