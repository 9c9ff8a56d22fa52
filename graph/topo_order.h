// Deterministic topological order of a graph's ops.
#pragma once

#include <vector>

#include "common/status.h"
#include "graph/ir.h"

namespace rdmaflow::graph {

// Kahn's algorithm; among ready ops the one added first goes first, so the
// order follows the file wherever the edges allow. On a cycle the error names
// the ops of one cycle: "cycle: a -> b -> c -> a".
Result<std::vector<OpId>> topological_order(const Graph& graph);

}  // namespace rdmaflow::graph
