// Small helpers shared by the graph and plan JSON readers and writers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace rdmaflow::graph {

// Parses `text` without throwing. Refuses documents nested deeper than
// kMaxJsonDepth (checked before parsing, so hostile nesting costs no stack).
Result<nlohmann::json> parse_json_text(std::string_view text, const char* op);

// An integral JSON number that fits in int64_t; nullopt for anything else.
std::optional<int64_t> json_int(const nlohmann::json& v);

// Compact dump that never throws (invalid UTF-8 is replaced).
std::string json_dump(const nlohmann::json& v);
std::string json_dump(const nlohmann::ordered_json& v);

}  // namespace rdmaflow::graph
