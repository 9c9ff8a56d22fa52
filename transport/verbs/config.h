// The verbs backend's environment knobs (documented in docs/configuration.md
// and docs/soft-roce.md). Parsed before any device is touched, so a malformed
// value is reported as such even on a machine without RDMA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace rdmaflow::verbs {

struct VerbsConfig {
  std::optional<std::string> device;  // RDMAFLOW_IB_DEVICE (e.g. rxe0, mlx5_0); auto if unset
  std::optional<uint32_t> port;       // RDMAFLOW_IB_PORT (1-based); first ACTIVE port if unset
  std::optional<uint32_t> gid_index;  // RDMAFLOW_IB_GID_INDEX; RoCE v2 IPv4-mapped if unset
  uint32_t sq_depth = 128;            // RDMAFLOW_IB_SQ_DEPTH: work requests in flight per QP
  uint32_t recv_credits = 64;         // RDMAFLOW_IB_RECV_CREDITS: buffers reserved per peer
  uint32_t msg_size = 8192;           // RDMAFLOW_IB_MSG_SIZE: bytes per receive buffer
  uint32_t max_peers = 64;            // RDMAFLOW_IB_MAX_PEERS: sizes the shared receive queue

  static Result<VerbsConfig> from_env();
};

}  // namespace rdmaflow::verbs
