// Typed access to RDMAFLOW_* environment knobs. Every knob is documented in
// docs/configuration.md; a malformed value is an error naming the variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace rdmaflow {

std::optional<std::string> env_string(const char* name);

// Parses an integer knob; unset gives `fallback`, garbage gives kInvalidArgument.
Result<int64_t> env_int(const char* name, int64_t fallback);

// RDMAFLOW_TIMEOUT_MS: the default deadline of every wait (default 30000 ms).
std::chrono::milliseconds default_timeout();

}  // namespace rdmaflow
