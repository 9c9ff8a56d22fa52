#include "transport/verbs/flow_control.h"

#include <algorithm>

namespace rdmaflow::verbs {

CreditCounter::CreditCounter(uint32_t peer_window, uint32_t local_window)
    : peer_window_(peer_window),
      available_(peer_window),
      // >= 2 so two credit messages never answer each other forever; <= window - 1
      // so a sender that is down to its reserved credit always triggers a return.
      threshold_(std::max<uint32_t>(2, local_window / 2)) {}

bool CreditCounter::consume(bool credit_message) {
  if (credit_message ? !can_send_credit_message() : !can_send()) return false;
  --available_;
  return true;
}

bool CreditCounter::grant(uint32_t n) {
  if (n > peer_window_ - available_) return false;
  available_ += n;
  return true;
}

}  // namespace rdmaflow::verbs
