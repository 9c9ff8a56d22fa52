#include "graph/model_format.h"

#include <charconv>
#include <cstdio>

namespace rdmaflow::graph {

namespace {

// Keys (field number << 3 | wire type) of ModelProto's fields in onnx.proto:
// ir_version 1 (varint), producer_name 2, producer_version 3, domain 4 (bytes),
// model_version 5 (varint), doc_string 6, graph 7, opset_import 8, metadata_props
// 14, training_info 20 and functions 25 (bytes; the last two need a second key
// byte). The first byte alone is enough to tell ONNX from JSON and from text.
bool is_model_proto_key(unsigned char b0, unsigned char b1) {
  switch (b0) {
    case 0x08:  // ir_version
    case 0x12:  // producer_name
    case 0x1a:  // producer_version
    case 0x22:  // domain
    case 0x28:  // model_version
    case 0x32:  // doc_string
    case 0x3a:  // graph
    case 0x42:  // opset_import
    case 0x72:  // metadata_props
      return true;
    case 0xa2:  // training_info (20 << 3 | 2 = 0xa2 0x01)
    case 0xca:  // functions (25 << 3 | 2 = 0xca 0x01)
      return b1 == 0x01;
    default:
      return false;
  }
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

}  // namespace

ModelFormat detect_model_format(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size() && is_blank(bytes[i])) ++i;
  if (i < bytes.size() && bytes[i] == '{') return ModelFormat::kJson;
  if (bytes.empty()) return ModelFormat::kUnknown;
  auto b0 = static_cast<unsigned char>(bytes[0]);
  auto b1 = bytes.size() > 1 ? static_cast<unsigned char>(bytes[1]) : 0;
  return is_model_proto_key(b0, b1) ? ModelFormat::kOnnx : ModelFormat::kUnknown;
}

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::kJson:
      return "JSON";
    case ModelFormat::kOnnx:
      return "ONNX";
    case ModelFormat::kUnknown:
      break;
  }
  return "unknown";
}

std::string describe_start(std::string_view bytes) {
  if (bytes.empty()) return "empty";
  std::string s = "starts with bytes";
  for (size_t i = 0; i < bytes.size() && i < 4; ++i) {
    char hex[8];
    std::snprintf(hex, sizeof hex, " %02x", static_cast<unsigned char>(bytes[i]));
    s += hex;
  }
  return s;
}

Status parse_dim_binding(std::string_view text, std::map<std::string, int64_t>& dims) {
  auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse --dim", -1,
                          "'" + std::string(text) + "' is not NAME=VALUE (e.g. batch=8)");
  }
  auto value = text.substr(eq + 1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 1 || v > kMaxDimBinding) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse --dim", -1,
                          "'" + std::string(text) + "': the value must be an integer in 1..2^48");
  }
  dims[std::string(text.substr(0, eq))] = v;
  return Status::ok();
}

}  // namespace rdmaflow::graph
