// WakeSocket: what a rank's fd sleepers (common/doorbell.h) ppoll on, so that
// same-host peers can wake a thread that also waits on sockets (a rank with
// peers on other hosts). A unix datagram socket, autobound to an abstract
// address the kernel picks (no file, no name to clean up or collide); peers
// connect a datagram socket of their own to that address (WakeSender) and
// their doorbell rings send one byte over it. UCX's shared-memory transports
// wake their sleepers the same way (uct_mm_iface: a datagram socket per
// interface that senders signal).
//
// Abstract addresses belong to a network namespace: a peer in another one
// (a container sharing only /dev/shm) cannot connect, and says so at
// connect time (MemoryEndpoint::connect_all); the rank then never sleeps on
// a file descriptor. Anybody in the namespace may send to the address: a
// stranger's datagrams only wake the sleeper, which looks at its words and
// sleeps again.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"

namespace rdmaflow::shm {

// An owned file descriptor (closed with the object).
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

class WakeSocket {
 public:
  // A nonblocking socket on a fresh abstract address.
  static Result<WakeSocket> open();
  int fd() const { return fd_.get(); }
  // The address peers connect to (the bytes of sun_path, leading NUL included).
  const std::vector<uint8_t>& address() const { return address_; }

 private:
  OwnedFd fd_;
  std::vector<uint8_t> address_;
};

// A nonblocking datagram socket connected to the wake socket at `address`;
// kNotViable when it cannot be reached (another network namespace).
Result<OwnedFd> connect_wake(const std::vector<uint8_t>& address, int peer);

// Reads every queued datagram (or eventfd count) of nonblocking `fd`.
void drain_wake_fd(int fd);

}  // namespace rdmaflow::shm
