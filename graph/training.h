// Training mode: a forward graph and its placement extended with the backward
// pass, so that planning it also plans every gradient transfer
// (docs/graph-plans.md, "Training mode").
//
// A tensor needs a gradient when it is floating point and depends on a weight
// (the output of a "Variable" op). For each forward op F with such an output,
// in reverse topological order, a backward op "<F>/grad" of type "<type>Grad"
// runs on F's rank: it reads the gradients of F's outputs and F's own inputs
// (the saved activations, so they stay alive until the backward pass, as in
// training), and writes one partial gradient per input that needs one. The
// partial gradients of a tensor are summed per rank ("AddN", where a rank has
// more than one) and then on the tensor's producer's rank, so an activation
// that crossed from rank s to rank d forward sends exactly one gradient from
// d back to s. Graph outputs that need a gradient are seeded by a "LossGrad"
// op beside their producer. Backward ops carry a "cost" attribute of twice
// their forward op's estimated cost (graph/cost.h), the usual ratio.
#pragma once

#include "common/status.h"
#include "graph/ir.h"
#include "graph/placement.h"

namespace rdmaflow::graph {

struct TrainingGraph {
  Graph graph;          // the forward ops and tensors first, unchanged, then the backward
  Placement placement;  // the forward placement, extended
  size_t gradient_tensors = 0;
};

// "grad/<tensor>": the gradient of a forward tensor (its total, on its
// producer's rank).
std::string gradient_name(const std::string& tensor);

// `placement` must place every op of `forward` (validate_placement).
Result<TrainingGraph> add_backward(const Graph& forward, const Placement& placement,
                                   uint64_t dynamic_hint);

}  // namespace rdmaflow::graph
