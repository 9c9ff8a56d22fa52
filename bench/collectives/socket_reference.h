// --vs socket: a plain TCP ping-pong between rank 0 and rank 1 (blocking
// sockets, TCP_NODELAY), timed like a collective call: one round trip of the
// row's size per iteration. It is the floor a small collective's latency is
// held to (docs/benchmarks.md, "Waits under load"): what the kernel's own
// wake-ups cost on the same path, under the same load, in the same run.
#pragma once

#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace rdmaflow::bench {

// The plain TCP sockets of the bench's socket references (--vs socket,
// --socket-ring, --vs plain): IPv4 sockets, set up here blocking (--vs plain
// then moves its bytes with nonblocking calls and poll()); a failure ends the
// job, naming the option and the step.
namespace plain_socket {

[[noreturn]] inline void fail(const char* option, const std::string& what) {
  std::fprintf(stderr, "rdmaflow_coll_bench: %s: %s failed\n", option, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

inline sockaddr_in ipv4(const std::string& address, int port, const char* option) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
    fail(option, "bad address " + address);
  }
  return sa;
}

// A listening socket on `address` at a port the kernel picks (into `port`),
// with room for `backlog` connections not yet accepted.
inline int listen_any(const std::string& address, int& port, const char* option, int backlog = 1) {
  sockaddr_in sa = ipv4(address, 0, option);
  socklen_t len = sizeof(sa);
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(lfd, backlog) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    fail(option, "listen on " + address);
  }
  port = ntohs(sa.sin_port);
  return lfd;
}

inline int connect_to(const std::string& address, int port, const char* option) {
  const sockaddr_in sa = ipv4(address, port, option);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    fail(option, "connect to " + address + ":" + std::to_string(port));
  }
  return fd;
}

// Accepts one connection and closes the listening socket.
inline int accept_one(int lfd, const char* option) {
  const int fd = ::accept(lfd, nullptr, nullptr);
  ::close(lfd);
  if (fd < 0) fail(option, "accept");
  return fd;
}

// Every rank's listening address and port, by rank (collective over
// MPI_COMM_WORLD): how the socket references find each other, through the
// launcher that started them.
struct Endpoint {
  std::string address;
  int port = 0;
};
inline std::vector<Endpoint> exchange_endpoints(const std::string& address, int port) {
  constexpr int kName = 64;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  char mine[kName] = {};
  std::snprintf(mine, sizeof(mine), "%s %d", address.c_str(), port);
  std::vector<char> all(static_cast<size_t>(world) * kName);
  MPI_Allgather(mine, kName, MPI_CHAR, all.data(), kName, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<Endpoint> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string e(&all[static_cast<size_t>(r) * kName]);
    const size_t space = e.find(' ');
    out[r] = {e.substr(0, space), std::atoi(e.c_str() + space + 1)};
  }
  return out;
}

}  // namespace plain_socket

class SocketPingPong {
 public:
  // Collective over MPI_COMM_WORLD. Rank 0 listens on its `address` (one
  // that reaches its host from the others'), which it sends to the others;
  // ranks other than 0 and 1 take no part.
  SocketPingPong(int rank, std::string address) : rank_(rank) {
    char name[64] = {};
    address.copy(name, sizeof(name) - 1);
    MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
    address = name;
    int port = 0, lfd = -1;
    if (rank == 0) lfd = plain_socket::listen_any(address, port, kOption);
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 1) fd_ = plain_socket::connect_to(address, port, kOption);
    if (rank == 0) fd_ = plain_socket::accept_one(lfd, kOption);
    if (fd_ >= 0) {
      int one = 1;
      ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
  }
  ~SocketPingPong() {
    if (fd_ >= 0) ::close(fd_);
  }
  SocketPingPong(const SocketPingPong&) = delete;
  SocketPingPong& operator=(const SocketPingPong&) = delete;

  // One round trip of `bytes`: rank 0 sends and waits for the echo.
  void round_trip(size_t bytes) {
    if (fd_ < 0) return;
    buf_.resize(bytes);
    if (rank_ == 0) {
      io(true, bytes);
      io(false, bytes);
    } else {
      io(false, bytes);
      io(true, bytes);
    }
  }

 private:
  void io(bool send, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = send ? ::send(fd_, buf_.data() + done, bytes - done, MSG_NOSIGNAL)
                             : ::recv(fd_, buf_.data() + done, bytes - done, 0);
      if (n <= 0) plain_socket::fail(kOption, send ? "send" : "recv");
      done += static_cast<size_t>(n);
    }
  }
  static constexpr const char* kOption = "--vs socket";
  const int rank_;
  int fd_ = -1;
  std::vector<char> buf_;
};

}  // namespace rdmaflow::bench
