// TransferPlan serialization (docs/graph-plans.md) and its hash.
//
// write_plan_json is deterministic: the same graph, placement and options give
// byte-identical text, so executors can cache plans and ranks can compare
// plan_hash() at setup. parse_plan_json reads it back into an equal plan and
// checks it (check_plan) so a stale or damaged cache is refused, not run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "graph/transfer_plan.h"

namespace rdmaflow::graph {

std::string write_plan_json(const TransferPlan& plan);
Result<TransferPlan> parse_plan_json(std::string_view text);

// fnv1a64 of write_plan_json(plan).
uint64_t plan_hash(const TransferPlan& plan);

// The plan's invariants: ids and ranks consistent, every slot and output
// buffer aligned, large enough and inside its rank's frame, no two buffers of
// a rank that are live at the same time share a byte, every transfer has
// exactly one Send and one Recv in the schedules. O(n log n).
Status check_plan(const TransferPlan& plan);

}  // namespace rdmaflow::graph
