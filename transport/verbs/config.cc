#include "transport/verbs/config.h"

#include <algorithm>

#include "common/env.h"
#include "transport/verbs/flow_control.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaflow::verbs {

namespace {
// Reads an integer knob and checks it lies in [lo, hi].
Result<std::optional<uint32_t>> bounded(const char* name, int64_t lo, int64_t hi) {
  if (!env_string(name)) return std::optional<uint32_t>();
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t v, env_int(name, 0));
  if (v < lo || v > hi) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "read environment", -1,
                          std::string(name) + "=" + std::to_string(v) + " is outside [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return std::optional<uint32_t>(static_cast<uint32_t>(v));
}
}  // namespace

Result<VerbsConfig> VerbsConfig::from_env() {
  VerbsConfig c;
  c.device = env_string("RDMAFLOW_IB_DEVICE");
  RDMAFLOW_ASSIGN_OR_RETURN(c.port, bounded("RDMAFLOW_IB_PORT", 1, 255));
  RDMAFLOW_ASSIGN_OR_RETURN(c.gid_index, bounded("RDMAFLOW_IB_GID_INDEX", 0, 65535));
  RDMAFLOW_ASSIGN_OR_RETURN(auto sq, bounded("RDMAFLOW_IB_SQ_DEPTH", 2, 32768));
  RDMAFLOW_ASSIGN_OR_RETURN(auto credits,
                            bounded("RDMAFLOW_IB_RECV_CREDITS", kMinCreditWindow, 4096));
  RDMAFLOW_ASSIGN_OR_RETURN(auto msg, bounded("RDMAFLOW_IB_MSG_SIZE", 256, kMaxMsgSize));
  RDMAFLOW_ASSIGN_OR_RETURN(auto peers, bounded("RDMAFLOW_IB_MAX_PEERS", 1, 4096));
  if (auto p = env_string("RDMAFLOW_IB_GRANT_PROTECTION")) {
    if (*p == "window") {
      c.grant_protection = GrantProtection::kWindow;
    } else if (*p == "slab") {
      c.grant_protection = GrantProtection::kSlab;
    } else if (*p != "auto") {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, "read environment", -1,
          "RDMAFLOW_IB_GRANT_PROTECTION='" + *p + "' is not one of auto, window, slab");
    }
  }
  if (sq) c.sq_depth = *sq;
  if (credits) c.recv_credits = *credits;
  if (msg) c.msg_size = *msg;
  if (peers) c.max_peers = *peers;
  // The same knob and default as tcp and ucx; larger values are held to the
  // reassembler's own bound.
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t max_message, env_int("RDMAFLOW_MAX_MESSAGE_BYTES",
                                                         static_cast<int64_t>(c.max_message)));
  if (max_message < 1) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "read environment", -1,
        "RDMAFLOW_MAX_MESSAGE_BYTES=" + std::to_string(max_message) + " must be >= 1");
  }
  c.max_message = std::min<uint64_t>(static_cast<uint64_t>(max_message), kMaxMessageBytes);
  return c;
}

}  // namespace rdmaflow::verbs
