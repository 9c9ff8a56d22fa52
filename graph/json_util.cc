#include "graph/json_util.h"

#include <limits>

#include "graph/graph_json.h"
#include "graph/model_format.h"

namespace rdmaflow::graph {

namespace {

// Byte offset where nesting first exceeds `limit`, or npos.
size_t too_deep_at(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

Result<nlohmann::json> parse_json_text(std::string_view text, const char* op) {
  // Every rdmaflow document is an object (an array gets the usual "must be
  // an object"): anything else is answered with what the bytes are instead of
  // a parser error deep inside a binary file.
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (detect_model_format(text) != ModelFormat::kJson &&
      (first == std::string_view::npos || text[first] != '[')) {
    std::string reason = "not a JSON document (" + describe_start(text) + "; expected '{')";
    if (detect_model_format(text) == ModelFormat::kOnnx) {
      reason +=
          "; it looks like an ONNX model: load it with the ONNX loader "
          "(rdmaflow-plan chooses by content)";
    }
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, reason);
  }
  size_t at = too_deep_at(text, kMaxJsonDepth);
  if (at != std::string_view::npos) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                              " levels at byte " + std::to_string(at));
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, e.what());
  } catch (const std::exception& e) {
    return RDMAFLOW_ERROR(Code::kInternal, op, -1, e.what());
  }
}

std::optional<int64_t> json_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::string json_dump(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_dump(const nlohmann::ordered_json& v) {
  return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace rdmaflow::graph
