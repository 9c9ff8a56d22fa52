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
  // RDMAFLOW_MAX_MESSAGE_BYTES: the largest control message a peer may send
  // (fragments joined); at most kMaxMessageBytes, the backend's own bound.
  uint64_t max_message = uint64_t{64} << 20;
  // RDMAFLOW_IB_GRANT_PROTECTION: how the NIC confines a peer to its grants.
  //   window  a memory window (type 2) per grant and peer, bound on that peer's
  //           queue pair when it first presents the key, invalidated on revoke;
  //           slabs are registered without remote access
  //   slab    the slab's rkey (rdmaflow's key check only; docs/security.md)
  //   auto    window where the device supports type 2 windows, else slab
  enum class GrantProtection { kAuto, kWindow, kSlab };
  GrantProtection grant_protection = GrantProtection::kAuto;

  static Result<VerbsConfig> from_env();
};

}  // namespace rdmaflow::verbs
