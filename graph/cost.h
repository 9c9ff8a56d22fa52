// Estimated compute per op, for balancing pipeline stages (graph/pipeline.h).
//
// An estimate from shapes alone, in FLOPs: Conv and ConvTranspose, MatMul and
// Gemm (and their integer / quantized forms) count 2 x multiply-adds; every
// other op counts the bytes it reads and writes times kFlopsPerByte, as
// memory-bound work. Ops without inputs (Input, Variable, Constant) cost
// nothing. An op's "cost" attribute (a number), when present, is taken as is:
// the training graph sets it on backward ops, and a JSON graph can set it.
// A dynamic tensor counts as its size hint (else PlanOptions' default hint).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ir.h"

namespace rdmaflow::graph {

// What one byte of memory-bound work counts as: a machine balance between a
// CPU's (~10 FLOPs per byte of memory bandwidth) and a GPU's (~50-100).
inline constexpr double kFlopsPerByte = 16.0;

// Bytes of a tensor for planning: exact when static, else its size hint, else
// `dynamic_hint`.
uint64_t planning_bytes(const Tensor& t, uint64_t dynamic_hint);

// The estimate for every op of `g`, indexed by OpId.
std::vector<double> estimate_costs(const Graph& g, uint64_t dynamic_hint);

}  // namespace rdmaflow::graph
