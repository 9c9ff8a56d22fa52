// analyze(): from a partitioned graph to a TransferPlan.
//
// Schedules each rank (make_schedule), computes when every cross-rank buffer
// is in use (cross_rank_liveness), sizes slots and output buffers, and places
// them per rank (plan_memory) with reuse between disjoint lifetimes.
#pragma once

#include "common/status.h"
#include "graph/partition.h"
#include "graph/placement.h"
#include "graph/transfer_plan.h"

namespace rdmaflow::graph {

Status validate_options(const PlanOptions& options);

Result<TransferPlan> analyze(const PartitionedGraph& pg, const PlanOptions& options = {});

// validate + partition + analyze.
Result<TransferPlan> plan_transfers(const Graph& graph, const Placement& placement, int num_ranks,
                                    const PlanOptions& options = {});

}  // namespace rdmaflow::graph
