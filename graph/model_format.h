// Which format a model file is in, judged by its bytes, not its name.
//
// rdmaflow reads two: its own JSON graph (docs/graph-format.md) and ONNX
// (graph/onnx/, docs/graph-format.md "ONNX models"). A JSON graph starts,
// after blanks, with '{'; an ONNX model is a protobuf ModelProto, whose first
// byte is the key of one of its fields (exporters write ir_version first:
// 0x08). Anything else is neither, and the error says what it starts with.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace rdmaflow::graph {

enum class ModelFormat { kJson, kOnnx, kUnknown };

ModelFormat detect_model_format(std::string_view bytes);

// "JSON", "ONNX", "unknown".
const char* model_format_name(ModelFormat f);

// For errors: "empty", or "starts with bytes 08 07 12 07" (first few, hex).
std::string describe_start(std::string_view bytes);

// Largest value a symbolic dimension may be bound to (and largest ONNX dimension).
inline constexpr int64_t kMaxDimBinding = int64_t{1} << 48;

// "batch=8" -> dims["batch"] = 8 (rdmaflow-plan --dim); the value must be an
// integer in 1..kMaxDimBinding.
Status parse_dim_binding(std::string_view text, std::map<std::string, int64_t>& dims);

}  // namespace rdmaflow::graph
