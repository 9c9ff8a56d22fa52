#include "graph/ir.h"

#include <utility>

namespace rdmaflow::graph {

namespace {
constexpr const char* kBuildOp = "build graph";

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}
}  // namespace

bool is_static(const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

std::optional<uint64_t> static_bytes(DataType dtype, const Shape& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    uint64_t r = 0;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &r)) return std::nullopt;
    n = r;
  }
  if (n > (uint64_t{1} << 63)) return std::nullopt;
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

Result<TensorId> Graph::add_tensor(std::string name, DataType dtype, Shape shape,
                                   uint64_t size_hint) {
  if (name.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                          "tensor #" + std::to_string(tensors_.size()) + " has an empty name");
  }
  auto id = static_cast<TensorId>(tensors_.size());
  auto [it, inserted] = tensor_index_.try_emplace(name, id);
  if (!inserted) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                          "duplicate tensor name " + quoted(name));
  }
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.size_hint = size_hint;
  tensors_.push_back(std::move(t));
  return id;
}

Result<OpId> Graph::add_op(std::string name, std::string type,
                           const std::vector<std::string>& inputs,
                           const std::vector<std::string>& outputs, Attributes attrs) {
  std::vector<TensorId> in, out;
  in.reserve(inputs.size());
  out.reserve(outputs.size());
  for (const auto& n : inputs) {
    auto id = find_tensor(n);
    if (!id) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                            "op " + quoted(name) + ": dangling input " + quoted(n) +
                                " (no tensor of that name is declared)");
    }
    in.push_back(*id);
  }
  for (const auto& n : outputs) {
    auto id = find_tensor(n);
    if (!id) {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, kBuildOp, -1,
          "op " + quoted(name) + ": output " + quoted(n) + " is not a declared tensor");
    }
    out.push_back(*id);
  }
  return add_op_ids(std::move(name), std::move(type), std::move(in), std::move(out),
                    std::move(attrs));
}

Result<OpId> Graph::add_op_ids(std::string name, std::string type, std::vector<TensorId> inputs,
                               std::vector<TensorId> outputs, Attributes attrs) {
  if (name.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                          "op #" + std::to_string(ops_.size()) + " has an empty name");
  }
  if (op_index_.count(name)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                          "duplicate op name " + quoted(name));
  }
  auto ntensors = static_cast<TensorId>(tensors_.size());
  for (TensorId t : inputs) {
    if (t < 0 || t >= ntensors) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                            "op " + quoted(name) + ": input tensor id out of range");
    }
  }
  auto id = static_cast<OpId>(ops_.size());
  // Claim the outputs one by one; undo the claims if one of them fails.
  auto undo = [&](size_t n) {
    for (size_t j = 0; j < n; ++j) tensors_[static_cast<size_t>(outputs[j])].producer = kNoOp;
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorId t = outputs[i];
    if (t < 0 || t >= ntensors) {
      undo(i);
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                            "op " + quoted(name) + ": output tensor id out of range");
    }
    Tensor& tensor = tensors_[static_cast<size_t>(t)];
    if (tensor.producer == id) {
      undo(i);
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, kBuildOp, -1,
          "op " + quoted(name) + " lists output " + quoted(tensor.name) + " twice");
    }
    if (tensor.producer != kNoOp) {
      std::string other = ops_[static_cast<size_t>(tensor.producer)].name;
      undo(i);
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kBuildOp, -1,
                            "tensor " + quoted(tensor.name) + " has two producers: op " +
                                quoted(other) + " and op " + quoted(name));
    }
    tensor.producer = id;
  }
  op_index_.emplace(name, id);
  for (TensorId t : inputs) {
    auto& consumers = tensors_[static_cast<size_t>(t)].consumers;
    if (consumers.empty() || consumers.back() != id) consumers.push_back(id);
  }
  Op op;
  op.name = std::move(name);
  op.type = std::move(type);
  op.attrs = std::move(attrs);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  ops_.push_back(std::move(op));
  return id;
}

void Graph::reserve(size_t ops, size_t tensors) {
  ops_.reserve(ops);
  op_index_.reserve(ops);
  tensors_.reserve(tensors);
  tensor_index_.reserve(tensors);
}

std::optional<OpId> Graph::find_op(std::string_view name) const {
  auto it = op_index_.find(name);
  if (it == op_index_.end()) return std::nullopt;
  return it->second;
}

std::optional<TensorId> Graph::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) return std::nullopt;
  return it->second;
}

}  // namespace rdmaflow::graph
