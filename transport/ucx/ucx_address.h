// The UCX backend's listen address and process identity.
//
// listen() returns
//   "ucx:1:<boot id>:<pid namespace>:<pid>:<start time>:<checksum>:<hex worker address>".
// The worker address (ucp_worker_get_address) is what UCP needs to reach the
// worker; the identity in front of it tells a connecting process whether the
// peer runs on the same host (same boot id and pid namespace) and, if so, lets
// it watch the peer process with a pidfd: UCX 1.13's shared-memory transports
// cannot report a dead peer (docs/ucx.md, "Peer failure").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace rdmaflow::ucx {

struct ProcessIdentity {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id
  uint64_t pid_ns = 0;  // inode of /proc/self/ns/pid
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat (clock ticks since boot)
};

struct PeerAddress {
  ProcessIdentity identity;
  std::vector<uint8_t> worker;  // ucp_address_t bytes
};

// This process's identity (computed once).
const ProcessIdentity& self_identity();

std::string encode_address(const ProcessIdentity& identity, std::span<const uint8_t> worker);

// kInvalidArgument naming what is wrong when `text` is not an address made by encode_address.
Result<PeerAddress> decode_address(const std::string& text);

// Same kernel and pid namespace: pids are comparable and shared memory is reachable.
bool same_host(const ProcessIdentity& a, const ProcessIdentity& b);

// A pidfd that becomes readable when the (same-host) peer process exits.
// kConnectionFailed when the process is gone or its pid was reused.
Result<int> open_peer_pidfd(const ProcessIdentity& peer, int peer_rank, const char* op);

}  // namespace rdmaflow::ucx
