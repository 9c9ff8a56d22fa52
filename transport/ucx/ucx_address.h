// The UCX backend's listen address.
//
// listen() returns
//   "ucx:1:<boot id>:<pid namespace>:<pid>:<start time>:<checksum>:<hex worker address>".
// The worker address (ucp_worker_get_address) is what UCP needs to reach the
// worker; the process identity in front of it (transport/shm/peer_process.h)
// tells a connecting process whether the peer runs on the same host (same boot
// id and pid namespace) and, if so, lets it watch the peer process with a
// pidfd: UCX 1.13's shared-memory transports cannot report a dead peer
// (docs/ucx.md, "Peer failure").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/peer_process.h"

namespace rdmaflow::ucx {

using shm::ProcessIdentity;

struct PeerAddress {
  ProcessIdentity identity;
  std::vector<uint8_t> worker;  // ucp_address_t bytes
};

std::string encode_address(const ProcessIdentity& identity, std::span<const uint8_t> worker);

// kInvalidArgument naming what is wrong when `text` is not an address made by encode_address.
Result<PeerAddress> decode_address(const std::string& text);

}  // namespace rdmaflow::ucx
