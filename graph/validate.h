// Validation: everything that makes a graph or a placement unusable, reported
// with the name of the op or tensor and what is wrong with it.
#pragma once

#include "common/status.h"
#include "graph/ir.h"
#include "graph/placement.h"

namespace rdmaflow::graph {

// Checks, in this order (the first problem found is returned):
//  - a tensor with an invalid dimension (below -1);
//  - a static tensor whose size overflows 2^63 bytes;
//  - a dangling input: an op reads a tensor that no op produces;
//  - a cycle (the error lists the ops on it).
// Duplicate names, inputs naming no tensor and second producers cannot be
// built (Graph::add_op refuses them) and the loader reports them.
Status validate(const Graph& graph);

// Checks that every op has a placement on a rank in [0, num_ranks) and a
// non-empty device name, and that `placement` was made for this graph.
Status validate_placement(const Graph& graph, const Placement& placement, int num_ranks);

}  // namespace rdmaflow::graph
