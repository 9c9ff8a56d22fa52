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

#define RDMAFLOW_LOG_TRACE(...) ::rdmaflow::logger().trace(__VA_ARGS__)
#define RDMAFLOW_LOG_DEBUG(...) ::rdmaflow::logger().debug(__VA_ARGS__)
#define RDMAFLOW_LOG_INFO(...) ::rdmaflow::logger().info(__VA_ARGS__)
#define RDMAFLOW_LOG_WARN(...) ::rdmaflow::logger().warn(__VA_ARGS__)
#define RDMAFLOW_LOG_ERROR(...) ::rdmaflow::logger().error(__VA_ARGS__)
