#include "common/fd_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace rdmaflow {

namespace {

int remaining_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// After EAGAIN: waits for `events`; false with `err` set at the deadline or on error.
bool wait_or_fail(int fd, short events, std::chrono::steady_clock::time_point deadline, int& err);

}  // namespace

int wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    return r == 0 ? 0 : 1;
  }
}

bool send_all(int fd, const void* data, size_t len, std::chrono::steady_clock::time_point deadline,
              int& err) {
  auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_or_fail(fd, POLLOUT, deadline, err)) return false;
      continue;
    }
    err = errno;
    return false;
  }
  return true;
}

bool recv_all(int fd, void* data, size_t len, std::chrono::steady_clock::time_point deadline,
              int& err) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      err = ECONNRESET;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_or_fail(fd, POLLIN, deadline, err)) return false;
      continue;
    }
    err = errno;
    return false;
  }
  return true;
}

namespace {
bool wait_or_fail(int fd, short events, std::chrono::steady_clock::time_point deadline, int& err) {
  const int r = wait_fd(fd, events, deadline);
  if (r > 0) return true;
  err = r == 0 ? ETIMEDOUT : errno;
  return false;
}
}  // namespace

}  // namespace rdmaflow
