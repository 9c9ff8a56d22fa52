#include "graph/validate.h"

#include <string>

#include "graph/topo_order.h"

namespace rdmaflow::graph {

namespace {
constexpr const char* kValidate = "validate graph";
constexpr const char* kValidatePlacement = "validate placement";

std::string q(const std::string& s) {
  return "'" + s + "'";
}
}  // namespace

Status validate(const Graph& g) {
  for (const Tensor& t : g.tensors()) {
    for (int64_t d : t.shape) {
      if (d < kUnknownDim) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidate, -1,
                              "tensor " + q(t.name) + ": invalid dimension " + std::to_string(d) +
                                  " in shape (use -1 for an unknown dimension)");
      }
    }
    if (is_static(t.shape) && !static_bytes(t.dtype, t.shape)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidate, -1,
                            "tensor " + q(t.name) + ": " + std::string(dtype_name(t.dtype)) +
                                shape_to_string(t.shape) + " is larger than 2^63 bytes");
    }
  }
  for (const Op& op : g.ops()) {
    for (TensorId t : op.inputs) {
      if (g.tensor(t).producer == kNoOp) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidate, -1,
                              "op " + q(op.name) + ": dangling input " + q(g.tensor(t).name) +
                                  " (no op produces it)");
      }
    }
  }
  auto order = topological_order(g);
  if (!order) return order.status();
  return Status::ok();
}

Status validate_placement(const Graph& g, const Placement& p, int num_ranks) {
  if (num_ranks < 1) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, kValidatePlacement, -1,
        "the number of ranks must be at least 1, got " + std::to_string(num_ranks));
  }
  if (p.rank.size() != g.num_ops() || p.device.size() != g.num_ops()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidatePlacement, -1,
                          "placement covers " + std::to_string(p.rank.size()) +
                              " ops but the graph has " + std::to_string(g.num_ops()));
  }
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const std::string& name = g.ops()[i].name;
    int r = p.rank[i];
    if (r == kUnplaced) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidatePlacement, -1,
                            "op " + q(name) + " has no placement");
    }
    if (r < 0 || r >= num_ranks) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidatePlacement, -1,
                            "op " + q(name) + " is placed on rank " + std::to_string(r) +
                                " but there are only " + std::to_string(num_ranks) + " ranks (0.." +
                                std::to_string(num_ranks - 1) + ")");
    }
    if (p.device[i].empty()) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kValidatePlacement, -1,
                            "op " + q(name) + " has an empty device name");
    }
  }
  return Status::ok();
}

}  // namespace rdmaflow::graph
