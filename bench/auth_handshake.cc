// What the job handshake (common/handshake.h) costs per connection: N loopback
// TCP connections, each accepted and closed, with the handshake and without it
// (the reference, in the same run), interleaved in rounds so both see the same
// machine. Prints the mean and median per connection and the difference; the
// target is under 1 ms (docs/security.md, docs/benchmarks.md).
//
//   auth_handshake_bench [--connections N]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/handshake.h"
#include "common/job_secret.h"

namespace {

using Clock = std::chrono::steady_clock;

int listen_loopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("listen");
    std::exit(1);
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// One connection, accepted by `server` (a thread), with or without the handshake.
// Returns its microseconds as the connector sees them: connect to authenticated.
double one(uint16_t port, int lfd, bool handshake) {
  std::thread server([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (handshake) {
      auto st = rdmaflow::auth::authenticate_accept(fd, "bench", "accept",
                                                    Clock::now() + std::chrono::seconds(5));
      if (!st.is_ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
    }
    ::close(fd);
  });
  const auto t0 = Clock::now();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::exit(1);
  if (handshake) {
    auto st = rdmaflow::auth::authenticate_connect(fd, "bench", "connect", 0,
                                                   Clock::now() + std::chrono::seconds(5));
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      std::exit(1);
    }
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  server.join();
  ::close(fd);
  return us;
}

struct Stats {
  double mean = 0, median = 0;
};
Stats stats(std::vector<double> v) {
  Stats s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--connections") n = std::max(10, std::atoi(argv[i + 1]));
  }
  uint16_t port = 0;
  const int lfd = listen_loopback(&port);
  std::vector<double> plain, authed;
  for (int i = 0; i < n; ++i) {  // interleaved: both see the same load
    plain.push_back(one(port, lfd, false));
    authed.push_back(one(port, lfd, true));
  }
  ::close(lfd);
  const Stats p = stats(plain), a = stats(authed);
  std::printf("connections: %d each, loopback TCP, secret from %s\n", n,
              rdmaflow::load_job_secret().is_ok() ? "load_job_secret()" : "(none)");
  std::printf("plain connect (reference): mean %8.1f us  median %8.1f us\n", p.mean, p.median);
  std::printf("connect + job handshake:   mean %8.1f us  median %8.1f us\n", a.mean, a.median);
  std::printf("handshake cost:            mean %8.1f us  median %8.1f us  (ratio %.2fx)\n",
              a.mean - p.mean, a.median - p.median, a.mean / p.mean);
  return 0;
}
