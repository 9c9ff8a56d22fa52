// --socket-ring SECONDS: what plain TCP sockets move in a ring allreduce's
// pattern, on the same hosts and cores, in the same run. Every rank sends to
// the next rank and receives from the previous one at once, the same bytes on
// every link (about SECONDS' worth, sized by a short first pass; 1 MiB
// blocking writes), timed from a common start until the slowest rank has
// sent and received them all. No reduction, no framing, no library: a ring
// allreduce moves as many bytes per link and does more work per byte. It is
// the reference that allreduce's busbw is read against, not a bound: a
// schedule that keeps one thread per rank on its sockets (no sender thread,
// no 1 MiB blocking writes) moved more on the 4 x 1 cluster (docs/benchmarks.md
// "Network targets in one run"), and iperf3 in the same ring
// (scripts/iperf-ring) is quoted beside it. On the simulated cluster every
// host shares this machine's cores, so once the ranks' own copies fill them
// the cores, not the tbf link, set the rate.
#pragma once

#include <mpi.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/collectives/socket_reference.h"

namespace rdmaflow::bench {

struct SocketRing {
  double MBps = 0;     // bytes per link over the slowest rank's time (MB = 1e6 bytes)
  double seconds = 0;  // the slowest rank's time
};

namespace socket_ring_detail {

constexpr const char* kOption = "--socket-ring";

// Every rank sends `bytes` to the next and receives as many from the
// previous, at once, from a common start; returns this rank's seconds until
// both are done.
inline double ring_pass(int in, int out, double bytes_d) {
  using Clock = std::chrono::steady_clock;
  const auto bytes = static_cast<size_t>(bytes_d);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  std::thread sender([&] {
    std::vector<char> chunk(1 << 20, 1);
    for (size_t sent = 0; sent < bytes;) {
      const ssize_t n =
          ::send(out, chunk.data(), std::min(chunk.size(), bytes - sent), MSG_NOSIGNAL);
      if (n <= 0) plain_socket::fail(kOption, "send");
      sent += static_cast<size_t>(n);
    }
  });
  std::vector<char> buf(1 << 20);
  for (size_t got = 0; got < bytes;) {
    const ssize_t n = ::recv(in, buf.data(), std::min(buf.size(), bytes - got), 0);
    if (n <= 0) plain_socket::fail(kOption, "recv");
    got += static_cast<size_t>(n);
  }
  sender.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double slowest(double mine) {
  double s = 0;
  MPI_Allreduce(&mine, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace socket_ring_detail

// Collective over MPI_COMM_WORLD (at least 2 ranks). `address`: this rank's
// own, one the previous rank's host reaches.
inline SocketRing measure_socket_ring(int rank, int world, const std::string& address,
                                      double seconds) {
  using namespace socket_ring_detail;
  int port = 0;
  const int lfd = plain_socket::listen_any(address, port, kOption);
  const plain_socket::Endpoint next =
      plain_socket::exchange_endpoints(address, port)[static_cast<size_t>((rank + 1) % world)];
  const int out = plain_socket::connect_to(next.address, next.port, kOption);
  const int in = plain_socket::accept_one(lfd, kOption);
  // A short pass sizes the timed one: every link then moves the same bytes
  // at once and the time is the slowest rank's (a ring is as fast as its
  // slowest link; a link that finishes early leaves its cores to the others).
  constexpr double kWarmBytes = 32 << 20;
  const double warm_s = slowest(ring_pass(in, out, kWarmBytes));
  const double bytes = std::max(kWarmBytes, kWarmBytes / std::max(warm_s, 1e-3) * seconds);
  const double s = slowest(ring_pass(in, out, bytes));
  ::close(in);
  ::close(out);
  SocketRing ring;
  ring.seconds = s;
  ring.MBps = s > 0 ? bytes / s / 1e6 : 0.0;
  return ring;
}

}  // namespace rdmaflow::bench
