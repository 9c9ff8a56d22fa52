// Deadline-bound I/O on a socket for connection setup (handshakes, hellos), where
// the calling thread may wait. Works on blocking and non-blocking descriptors
// alike: every call polls before it blocks.
#pragma once

#include <chrono>
#include <cstddef>

namespace rdmaflow {

// Waits for `events` (POLLIN, POLLOUT) on `fd` until `deadline`. 1 ready, 0 timeout, -1 error.
int wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline);

// All `len` bytes or false with `err` set (ETIMEDOUT at the deadline, ECONNRESET on
// an orderly close while reading).
bool send_all(int fd, const void* data, size_t len, std::chrono::steady_clock::time_point deadline,
              int& err);
bool recv_all(int fd, void* data, size_t len, std::chrono::steady_clock::time_point deadline,
              int& err);

}  // namespace rdmaflow
