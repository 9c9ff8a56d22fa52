// Logging through spdlog. The level comes from RDMAFLOW_LOG_LEVEL
// (trace, debug, info, warn, error, off; default warn).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace rdmaflow {

// The process-wide "rdmaflow" logger, created on first use.
spdlog::logger& logger();

// Tags every later line with the rank ("[rank 2]") once bootstrap knows it.
void set_log_rank(int rank);

}  // namespace rdmaflow

// The arguments are evaluated only when the level is on (a debug line on a hot
// path costs one level check when it is off).
#define RDMAFLOW_LOG_AT(level, ...)                            \
  do {                                                         \
    ::spdlog::logger& rdmaflow_logger_ = ::rdmaflow::logger(); \
    if (rdmaflow_logger_.should_log(level)) {                  \
      rdmaflow_logger_.log(level, __VA_ARGS__);                \
    }                                                          \
  } while (false)
#define RDMAFLOW_LOG_TRACE(...) RDMAFLOW_LOG_AT(::spdlog::level::trace, __VA_ARGS__)
#define RDMAFLOW_LOG_DEBUG(...) RDMAFLOW_LOG_AT(::spdlog::level::debug, __VA_ARGS__)
#define RDMAFLOW_LOG_INFO(...) RDMAFLOW_LOG_AT(::spdlog::level::info, __VA_ARGS__)
#define RDMAFLOW_LOG_WARN(...) RDMAFLOW_LOG_AT(::spdlog::level::warn, __VA_ARGS__)
#define RDMAFLOW_LOG_ERROR(...) RDMAFLOW_LOG_AT(::spdlog::level::err, __VA_ARGS__)
