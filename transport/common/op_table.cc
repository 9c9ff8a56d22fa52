#include "transport/common/op_table.h"

namespace rdmaflow {

OpClock::time_point deadline_after(std::chrono::milliseconds timeout, OpClock::time_point now) {
  constexpr auto kMax =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::hours(24 * 365));
  if (timeout < std::chrono::milliseconds(0)) timeout = std::chrono::milliseconds(0);
  if (timeout > kMax) timeout = kMax;
  return now + timeout;
}

Status timeout_status(std::string op, int peer, std::chrono::milliseconds timeout,
                      std::string_view state, SourceLocation where) {
  std::string reason = "not completed within " + std::to_string(timeout.count()) + " ms";
  if (!state.empty()) {
    reason += " (";
    reason += state;
    reason += ")";
  }
  return Status(Code::kTimeout, std::move(op), peer, std::move(reason), where);
}

}  // namespace rdmaflow
