// Who a same-host peer process is, and how this process notices it exit.
//
// Shared memory reaches a peer only on the same kernel and pid namespace
// (same_host), and memory a dead peer left mapped here still accepts stores:
// neither a memcpy into it nor a sequence word fails when the peer is gone.
// So the same-host path watches the peer process itself with a pidfd, which
// becomes readable the moment the process exits (UCX 1.13's shared-memory
// transports cannot report a dead peer either; docs/ucx.md, "Peer failure").
// The identity's start time tells a reused pid from the peer that published
// the identity.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace rdmaflow::shm {

struct ProcessIdentity {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id
  uint64_t pid_ns = 0;  // inode of /proc/self/ns/pid
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat (clock ticks since boot)
};

// This process's identity (computed once).
const ProcessIdentity& self_identity();

// Same kernel and pid namespace: pids are comparable and shared memory is reachable.
bool same_host(const ProcessIdentity& a, const ProcessIdentity& b);

// A pidfd that becomes readable when the (same-host) peer process exits.
// kConnectionFailed when the process is gone or its pid was reused.
Result<int> open_peer_pidfd(const ProcessIdentity& peer, int peer_rank, const char* op);

// True once the process of `pidfd` has exited (a zero-timeout poll, no wait).
bool peer_exited(int pidfd);

}  // namespace rdmaflow::shm
