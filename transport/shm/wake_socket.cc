#include "transport/shm/wake_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace rdmaflow::shm {
namespace {

const char* kOp = "open wake socket";

Status sys_error(const char* op, int peer, const char* what) {
  return RDMAFLOW_ERROR(Code::kInternal, op, peer,
                        std::string(what) + " failed: " + std::strerror(errno));
}

}  // namespace

OwnedFd& OwnedFd::operator=(OwnedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) ::close(fd_);
}

Result<WakeSocket> WakeSocket::open() {
  WakeSocket w;
  w.fd_ = OwnedFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (w.fd_.get() < 0) return sys_error(kOp, -1, "socket(AF_UNIX, SOCK_DGRAM)");
  // Autobind: a bind with no path makes the kernel pick a unique abstract name.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (::bind(w.fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(sa_family_t)) != 0) {
    return sys_error(kOp, -1, "bind (autobind)");
  }
  socklen_t len = sizeof(addr);
  if (::getsockname(w.fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return sys_error(kOp, -1, "getsockname");
  }
  const size_t path = len - offsetof(sockaddr_un, sun_path);
  if (len <= offsetof(sockaddr_un, sun_path) || path > sizeof(addr.sun_path)) {
    return RDMAFLOW_ERROR(Code::kInternal, kOp, -1, "autobind gave no abstract address");
  }
  const auto* p = reinterpret_cast<const uint8_t*>(addr.sun_path);
  w.address_.assign(p, p + path);
  return w;
}

Result<OwnedFd> connect_wake(const std::vector<uint8_t>& address, int peer) {
  const char* op = "connect wake socket";
  sockaddr_un addr{};
  if (address.empty() || address.size() > sizeof(addr.sun_path)) {
    return RDMAFLOW_ERROR(Code::kProtocolError, op, peer,
                          "wake socket address of " + std::to_string(address.size()) +
                              " bytes (1.." + std::to_string(sizeof(addr.sun_path)) + " expected)");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, address.data(), address.size());
  OwnedFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return sys_error(op, peer, "socket(AF_UNIX, SOCK_DGRAM)");
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, peer,
                          std::string("the peer's wake socket is out of reach (another network "
                                      "namespace?): ") +
                              std::strerror(errno));
  }
  return fd;
}

void drain_wake_fd(int fd) {
  uint64_t buf[8];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
}

}  // namespace rdmaflow::shm
