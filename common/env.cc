#include "common/env.h"

#include <charconv>
#include <cstdlib>

#include "common/log.h"

namespace rdmaflow {

std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

Result<int64_t> env_int(const char* name, int64_t fallback) {
  auto v = env_string(name);
  if (!v) return fallback;
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || ptr != v->data() + v->size()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "read environment", -1,
                          std::string(name) + "='" + *v + "' is not an integer");
  }
  return out;
}

std::chrono::milliseconds default_timeout() {
  auto ms = env_int("RDMAFLOW_TIMEOUT_MS", 30000);
  if (!ms.is_ok() || *ms <= 0) {
    RDMAFLOW_LOG_WARN("RDMAFLOW_TIMEOUT_MS is not a positive integer; using 30000");
    return std::chrono::milliseconds(30000);
  }
  return std::chrono::milliseconds(*ms);
}

}  // namespace rdmaflow
