// A TCP port that was free on 127.0.0.1 a moment ago (bound, then released):
// for a rendezvous address that forked or launched ranks agree on before any
// of them listens. Another process may take it in between. The port comes
// from below the kernel's ephemeral range (net.ipv4.ip_local_port_range),
// from which connect() picks the local port of every outgoing connection: a
// port of that range released here may be the next one a connection of a
// test beside this one takes (runtime_mpirun_mesh's rendezvous once failed
// with "Address already in use" under ctest -j 2, 2026-11-28). Below it only
// an explicit bind takes a port, and a random one of those is rarely another
// test's. The ephemeral range's own (port 0) when nothing below it is free or
// the range starts too low. -1 when no socket could be bound.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace rdmaflow::dev {

namespace free_port_detail {

// Binds a socket to 127.0.0.1:`port` (0: the kernel picks) and returns the
// port it got, the socket closed again; -1 when the bind failed.
inline int try_bind(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  int got = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    got = ntohs(a.sin_port);
  }
  ::close(fd);
  return got;
}

// The first port of the kernel's ephemeral range (32768 when unreadable).
inline int ephemeral_low() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return f >> low && low > 0 ? low : 32768;
}

}  // namespace free_port_detail

inline int free_port() {
  using namespace free_port_detail;
  constexpr int kLowest = 10000;  // above the ports services listen on by convention
  const int high = ephemeral_low() - 1;
  if (high - kLowest >= 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(kLowest, high);
    for (int tries = 0; tries < 64; ++tries) {
      const int port = try_bind(pick(rng));
      if (port > 0) return port;
    }
  }
  return try_bind(0);
}

}  // namespace rdmaflow::dev
