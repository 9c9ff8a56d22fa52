#include "graph/onnx/onnx_types.h"

#include <utility>

#include "graph/graph_json.h"
#include "graph/onnx/onnx_loader.h"

namespace rdmaflow::graph::onnx_detail {

namespace {

Status bad(const std::string& reason) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "load ONNX", -1, reason);
}

// One dimension's value: a size in [0, kMaxOnnxDim].
Status check_dim(int64_t d, const std::string& what) {
  if (d < 0) return bad(what + ": dimension " + std::to_string(d) + " is negative");
  if (d > kMaxOnnxDim) {
    return bad(what + ": dimension " + std::to_string(d) +
               " is over 2^48 (no real tensor has one; is the file damaged?)");
  }
  return Status::ok();
}

Status check_rank(int n, const std::string& what) {
  if (n > static_cast<int>(kMaxDims)) {
    return bad(what + ": " + std::to_string(n) + " dimensions; at most " +
               std::to_string(kMaxDims) + " are supported");
  }
  return Status::ok();
}

// Elements of a static shape (dims already checked); nullopt on overflow.
std::optional<uint64_t> elements(const Shape& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

// How many values an initializer stores inline in its typed fields (raw_data
// aside), by the field its element type uses.
int typed_data_count(const onnx::TensorProto& t) {
  using TP = onnx::TensorProto;
  switch (t.data_type()) {
    case TP::FLOAT:
      return t.float_data_size();
    case TP::DOUBLE:
      return t.double_data_size();
    case TP::INT64:
      return t.int64_data_size();
    case TP::UINT32:
    case TP::UINT64:
      return t.uint64_data_size();
    default:  // int32, int16, int8, uint16, uint8, bool, float16, bfloat16
      return t.int32_data_size();
  }
}

}  // namespace

std::optional<DataType> dtype_of(int32_t elem_type) {
  using TP = onnx::TensorProto;
  switch (elem_type) {
    case TP::FLOAT:
      return DataType::kF32;
    case TP::DOUBLE:
      return DataType::kF64;
    case TP::FLOAT16:
      return DataType::kF16;
    case TP::BFLOAT16:
      return DataType::kBF16;
    case TP::INT32:
      return DataType::kI32;
    case TP::INT64:
      return DataType::kI64;
    case TP::UINT8:
      return DataType::kU8;
    case TP::INT8:
      return DataType::kI8;
    case TP::BOOL:
      return DataType::kBool;
    default:
      return std::nullopt;
  }
}

std::string elem_type_name(int32_t elem_type) {
  if (onnx::TensorProto_DataType_IsValid(elem_type)) {
    return onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(elem_type));
  }
  return "element type " + std::to_string(elem_type);
}

Result<DataType> dtype_or_error(int32_t elem_type, const std::string& what) {
  auto dt = dtype_of(elem_type);
  if (!dt) {
    return bad(what + ": " + elem_type_name(elem_type) +
               " has no rdmaflow dtype (supported: FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT32, "
               "INT64, UINT8, INT8, BOOL)");
  }
  return *dt;
}

Result<TensorType> convert_value_type(const onnx::TypeProto* type, const std::string& what,
                                      DimContext& dims) {
  TensorType out;
  out.shape = {kUnknownDim};
  if (!type || type->value_case() == onnx::TypeProto::VALUE_NOT_SET) return out;
  if (!type->has_tensor_type()) {
    return bad(what +
               " is not a tensor (a sequence, map, optional or sparse value); only "
               "dense tensors are supported");
  }
  const onnx::TypeProto::Tensor& tt = type->tensor_type();
  if (tt.elem_type() != onnx::TensorProto::UNDEFINED) {
    RDMAFLOW_ASSIGN_OR_RETURN(out.dtype, dtype_or_error(tt.elem_type(), what));
    out.known = true;
  }
  if (!tt.has_shape()) return out;  // rank unknown: one unknown dimension
  const auto& shape = tt.shape();
  RDMAFLOW_RETURN_IF_ERROR(check_rank(shape.dim_size(), what));
  out.shape.clear();
  uint64_t hint = dtype_size(out.dtype);
  bool hintable = true;
  for (const auto& d : shape.dim()) {
    if (d.has_dim_value()) {
      RDMAFLOW_RETURN_IF_ERROR(check_dim(d.dim_value(), what));
      out.shape.push_back(d.dim_value());
      hintable =
          hintable && !__builtin_mul_overflow(hint, static_cast<uint64_t>(d.dim_value()), &hint);
      continue;
    }
    out.shape.push_back(kUnknownDim);
    if (!d.has_dim_param() || d.dim_param().empty()) {
      hintable = false;
      continue;
    }
    dims.seen.insert(d.dim_param());
    const int64_t* bound = nullptr;
    if (dims.bindings) {
      auto it = dims.bindings->find(d.dim_param());
      if (it != dims.bindings->end()) bound = &it->second;
    }
    hintable =
        hintable && bound && !__builtin_mul_overflow(hint, static_cast<uint64_t>(*bound), &hint);
  }
  if (!is_static(out.shape) && hintable) out.size_hint = hint;
  out.known = out.known || !out.shape.empty();
  return out;
}

Result<TensorType> convert_initializer(const onnx::TensorProto& t, const std::string& what) {
  TensorType out;
  RDMAFLOW_ASSIGN_OR_RETURN(out.dtype, dtype_or_error(t.data_type(), what));
  out.known = true;
  RDMAFLOW_RETURN_IF_ERROR(check_rank(t.dims_size(), what));
  for (int64_t d : t.dims()) {
    RDMAFLOW_RETURN_IF_ERROR(check_dim(d, what));
    out.shape.push_back(d);
  }
  auto bytes = static_bytes(out.dtype, out.shape);
  auto count = elements(out.shape);
  if (!bytes || !count) {
    return bad(what + ": " + std::string(dtype_name(out.dtype)) + shape_to_string(out.shape) +
               " is larger than 2^63 bytes");
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return out;  // checked by the loader
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != *bytes) {
      return bad(what + ": " + std::to_string(t.raw_data().size()) + " bytes of data for " +
                 std::string(dtype_name(out.dtype)) + shape_to_string(out.shape) + " (" +
                 std::to_string(*bytes) + " bytes)");
    }
    return out;
  }
  const auto n = static_cast<uint64_t>(typed_data_count(t));
  // Half-precision values are packed one per int32; every other type one per element.
  if (n != *count && *count != 0) {
    return bad(what + ": " + std::to_string(n) + " values of data for " +
               std::string(dtype_name(out.dtype)) + shape_to_string(out.shape) + " (" +
               std::to_string(*count) + " elements)");
  }
  return out;
}

Result<Attributes> convert_attributes(const onnx::NodeProto& node, const std::string& what) {
  using AP = onnx::AttributeProto;
  Attributes attrs;
  for (const AP& a : node.attribute()) {
    if (a.type() == AP::GRAPH || a.type() == AP::GRAPHS || a.has_g() || a.graphs_size() > 0) {
      return bad(what + " has a nested graph (attribute '" + a.name() +
                 "'): subgraphs (If, Loop, Scan) are not supported; export the model with the "
                 "control flow unrolled, or place the node's work inside one op");
    }
    switch (a.type()) {
      case AP::INT:
        attrs.emplace(a.name(), AttrValue(static_cast<int64_t>(a.i())));
        break;
      case AP::FLOAT:
        attrs.emplace(a.name(), AttrValue(static_cast<double>(a.f())));
        break;
      case AP::STRING:
        attrs.emplace(a.name(), AttrValue(a.s()));
        break;
      case AP::INTS:
        attrs.emplace(a.name(), AttrValue(std::vector<int64_t>(a.ints().begin(), a.ints().end())));
        break;
      case AP::FLOATS:
        attrs.emplace(a.name(),
                      AttrValue(std::vector<double>(a.floats().begin(), a.floats().end())));
        break;
      case AP::STRINGS:
        attrs.emplace(a.name(),
                      AttrValue(std::vector<std::string>(a.strings().begin(), a.strings().end())));
        break;
      default:  // tensors, sparse tensors, type protos: values planning does not need
        break;
    }
  }
  if (!node.domain().empty() && node.domain() != "ai.onnx") {
    attrs.emplace("domain", AttrValue(node.domain()));
  }
  return attrs;
}

}  // namespace rdmaflow::graph::onnx_detail
