// ONNX types to rdmaflow's: element types, dimensions, attributes, and the
// checks that turn a damaged value into an error naming it (onnx_loader.h).
// Internal to graph/onnx.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/status.h"
#include "graph/ir.h"

namespace rdmaflow::graph::onnx_detail {

// The symbolic dimension bindings, and every symbolic name seen.
struct DimContext {
  const std::map<std::string, int64_t>* bindings = nullptr;
  std::set<std::string> seen;
};

struct TensorType {
  DataType dtype = DataType::kF32;
  Shape shape;
  uint64_t size_hint = 0;
  bool known = false;  // false: nothing known, f32[?] stands in
};

// The rdmaflow dtype of an ONNX element type; nullopt when it has none.
std::optional<DataType> dtype_of(int32_t elem_type);
// The same, or an error naming `what` and the type.
Result<DataType> dtype_or_error(int32_t elem_type, const std::string& what);
// "FLOAT", "UINT16", ... (for errors).
std::string elem_type_name(int32_t elem_type);

// A value's type (graph input, output or value_info) as a TensorType. `what`
// names it in errors ("tensor 'x'"). `type` may be null (nothing known).
Result<TensorType> convert_value_type(const onnx::TypeProto* type, const std::string& what,
                                      DimContext& dims);

// An initializer's dtype and dims; checks its inline data against them.
Result<TensorType> convert_initializer(const onnx::TensorProto& t, const std::string& what);

// Scalar and list attributes; tensors and type protos are left out. Fails on
// a subgraph attribute (If / Loop / Scan), naming it.
Result<Attributes> convert_attributes(const onnx::NodeProto& node, const std::string& what);

}  // namespace rdmaflow::graph::onnx_detail
