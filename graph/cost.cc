#include "graph/cost.h"

#include <string_view>

namespace rdmaflow::graph {

namespace {

double elements(const Tensor& t, uint64_t dynamic_hint) {
  return static_cast<double>(planning_bytes(t, dynamic_hint)) /
         static_cast<double>(dtype_size(t.dtype));
}

// A known dimension counted from the end (-1 = last); 0 when unknown.
double dim(const Tensor& t, int from_end) {
  const auto n = static_cast<int>(t.shape.size());
  if (n + from_end < 0) return 0;
  const int64_t d = t.shape[static_cast<size_t>(n + from_end)];
  return d < 0 ? 0 : static_cast<double>(d);
}

double attr_number(const Op& op, const char* key, double otherwise) {
  auto it = op.attrs.find(key);
  if (it == op.attrs.end()) return otherwise;
  if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  return otherwise;
}

// FLOPs of the ops whose work grows with a contraction, or 0 when unknown.
double contraction_flops(const Graph& g, const Op& op, uint64_t hint) {
  const std::string_view type = op.type;
  if (op.inputs.size() < 2 || op.outputs.empty()) return 0;
  const Tensor& a = g.tensor(op.inputs[0]);
  const Tensor& b = g.tensor(op.inputs[1]);
  const Tensor& out = g.tensor(op.outputs[0]);
  if (type == "Conv" || type == "ConvInteger" || type == "QLinearConv") {
    // weight [Cout, Cin/group, k...]: each output element reads Cin/group x k... inputs.
    const Tensor& w = type == "QLinearConv" && op.inputs.size() > 3 ? g.tensor(op.inputs[3]) : b;
    if (!is_static(w.shape) || w.shape.empty() || w.shape[0] == 0) return 0;
    const double per_out = elements(w, hint) / static_cast<double>(w.shape[0]);
    return 2 * elements(out, hint) * per_out;
  }
  if (type == "ConvTranspose") {
    // weight [Cin, Cout/group, k...]: each input element feeds Cout/group x k... outputs.
    if (!is_static(b.shape) || b.shape.empty() || b.shape[0] == 0) return 0;
    return 2 * elements(a, hint) * elements(b, hint) / static_cast<double>(b.shape[0]);
  }
  if (type == "MatMul" || type == "MatMulInteger" || type == "FusedMatMul") {
    double k = dim(a, -1);
    if (k == 0) k = b.shape.size() >= 2 ? dim(b, -2) : dim(b, -1);
    return 2 * elements(out, hint) * k;
  }
  if (type == "Gemm") {
    const bool trans_a = attr_number(op, "transA", 0) != 0;
    const double k = a.shape.size() == 2 ? dim(a, trans_a ? -2 : -1) : 0;
    return 2 * elements(out, hint) * k;
  }
  return 0;
}

}  // namespace

uint64_t planning_bytes(const Tensor& t, uint64_t dynamic_hint) {
  if (auto b = static_bytes(t.dtype, t.shape)) return *b;
  return t.size_hint ? t.size_hint : dynamic_hint;
}

std::vector<double> estimate_costs(const Graph& g, uint64_t hint) {
  std::vector<double> cost(g.num_ops(), 0.0);
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const Op& op = g.ops()[i];
    if (double c = attr_number(op, "cost", -1); c >= 0) {
      cost[i] = c;
      continue;
    }
    if (op.inputs.empty()) continue;  // Input, Variable, Constant: no work in a step
    if (double f = contraction_flops(g, op, hint); f > 0) {
      cost[i] = f;
      continue;
    }
    double bytes = 0;
    for (TensorId t : op.inputs) bytes += static_cast<double>(planning_bytes(g.tensor(t), hint));
    for (TensorId t : op.outputs) bytes += static_cast<double>(planning_bytes(g.tensor(t), hint));
    cost[i] = bytes * kFlopsPerByte;
  }
  return cost;
}

}  // namespace rdmaflow::graph
