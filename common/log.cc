#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace rdmaflow {

namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("rdmaflow", sink);
  log->set_pattern("[%H:%M:%S.%e] [rdmaflow] [%^%l%$] %v");
  spdlog::level::level_enum level = spdlog::level::warn;
  if (const char* env = std::getenv("RDMAFLOW_LOG_LEVEL"); env != nullptr && *env != '\0') {
    level = spdlog::level::from_str(env);  // unknown strings map to "off"
    if (level == spdlog::level::off && std::string(env) != "off") {
      level = spdlog::level::warn;
      log->set_level(level);
      log->warn(
          "RDMAFLOW_LOG_LEVEL='{}' is not one of trace, debug, info, warn, error, off; "
          "using warn",
          env);
    }
  }
  log->set_level(level);
  log->flush_on(spdlog::level::warn);
  return log;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = make_logger();
  return *log;
}

void set_log_rank(int rank) {
  logger().set_pattern("[%H:%M:%S.%e] [rdmaflow] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
}

}  // namespace rdmaflow
