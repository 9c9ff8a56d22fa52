// The two processes of bench/p2p and what they measure besides the transports:
// options, the out-of-band channel, plain-socket helpers, size lists, the
// ping-pong timer, and the plain-socket and memcpy references.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/cpu_load.h"
#include "common/handshake.h"
#include "runtime/selection/transport_select.h"
#include "tools/cli.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow::bench {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct Options {
  std::vector<std::string> transports;  // empty = every registered backend
  bool quick = false;
  bool json = false;
  bool spin = false;            // busy-wait for notifies instead of blocking
  bool interleave = false;      // latency: socket and transport round trips in turn
  bool grpc = true;             // measure the gRPC reference
  bool default_malloc = false;  // the gRPC reference without the malloc tunables
  int rank = -1;                // -1 = fork both processes here
  std::string rendezvous;
  std::string host = "127.0.0.1";  // rank 0's address for the reference socket
  std::string json_file;           // also write the JSON report there
  double link_seconds = 2;         // each link-rate measurement; 0: none
  size_t lat_min = 8, lat_max = 1 << 20;
  size_t bw_min = 1 << 10, bw_max = 256u << 20;
  double seconds = 0.25;  // measuring time per size and contender
  int load = 0;           // busy processes competing for the CPUs (CpuLoad)
};

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "p2p: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

inline void check(const Status& st, const char* what) {
  if (!st.is_ok()) die(std::string(what) + ": " + st.to_string());
}

// ------------------------------------------------------------ plain sockets

inline bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

inline bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Out-of-band channel between the two processes: length-prefixed strings.
struct Oob {
  int fd = -1;
  void send(const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    if (!write_all(fd, &n, 4) || !write_all(fd, s.data(), s.size())) die("oob send failed");
  }
  std::string recv() {
    uint32_t n = 0;
    if (!read_all(fd, &n, 4)) die("oob: peer went away");
    std::string s(n, '\0');
    if (n > 0 && !read_all(fd, s.data(), n)) die("oob: peer went away");
    return s;
  }
  uint64_t recv_u64() { return std::stoull(recv()); }
};

inline int listen_on(const std::string& host, uint16_t port, uint16_t* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) die("bad IPv4 address " + host);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) {
    die(std::string("reference listen: ") + std::strerror(errno));
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *bound = ntohs(a.sin_port);
  return fd;
}

// The two ranks' sockets (out-of-band, plain-socket reference) start with the job
// handshake (common/handshake.h) like every rdmaflow connection: rank 0 takes the
// first connection that proves the job secret, not the first one to arrive, so a
// stray connection (a port scan, a health check) cannot pose as the peer.
constexpr const char* kHandshakeLabel = "p2p";

inline int connect_to(const std::string& host, uint16_t port, Millis timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) die("bad IPv4 address " + host);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      int err = 0;
      Status st =
          auth::authenticate_connect(fd, kHandshakeLabel, "connect to rank 0", 0, deadline, &err);
      if (st.is_ok()) return fd;
      if (err == 0) die(st.to_string());  // refused: a retry cannot succeed
    }
    ::close(fd);
    if (Clock::now() > deadline) die("cannot connect to " + host + ":" + std::to_string(port));
    std::this_thread::sleep_for(Millis(50));
  }
}

// Rank 0 takes the first connection that passes the job handshake. Each
// connection handshakes on a thread of its own, so a stray (a port scan, a
// health check, an idle or garbage-sending client, a peer of another job)
// costs the real peer nothing: it is refused and logged with its address when
// its handshake fails or times out (RDMAFLOW_AUTH_TIMEOUT_MS), or dropped when
// the peer wins. At most RDMAFLOW_AUTH_PENDING_MAX wait at once; more are
// closed at once, logged.
inline int accept_one(int listen_fd) {
  struct Pending {
    int fd = -1;
    std::string address;
    std::atomic<bool> done{false};
    Status status;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  int winner = -1;
  // Joins the handshakes that ended: a refused one is logged and closed, the
  // first good one wins (a later good one is a second peer: dropped below).
  auto reap = [&] {
    for (auto it = pending.begin(); it != pending.end();) {
      Pending& p = **it;
      if (!p.done.load()) {
        ++it;
        continue;
      }
      p.thread.join();
      if (p.status.is_ok() && winner < 0) {
        winner = p.fd;
      } else {
        const std::string why = p.status.is_ok()
                                    ? "dropped " + p.address + ": a peer rank connected first"
                                    : p.status.to_string();
        std::fprintf(stderr, "p2p: %s%s\n", why.c_str(),
                     winner < 0 ? "; still waiting for the peer" : "");
        ::close(p.fd);
      }
      it = pending.erase(it);
    }
  };
  while (winner < 0) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, 20);
    if (ready < 0 && errno != EINTR) die(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0 && errno != EINTR && errno != ECONNABORTED) {
        die(std::string("accept: ") + std::strerror(errno));
      }
      if (fd >= 0 && static_cast<int>(pending.size()) >= auth::max_pending_handshakes()) {
        std::fprintf(stderr,
                     "p2p: refused %s: %zu connections already in the handshake "
                     "(RDMAFLOW_AUTH_PENDING_MAX); still waiting for the peer\n",
                     auth::peer_address(fd).c_str(), pending.size());
        ::close(fd);
      } else if (fd >= 0) {
        auto p = std::make_unique<Pending>();
        p->fd = fd;
        p->address = auth::peer_address(fd);
        p->thread = std::thread([q = p.get()] {
          q->status = auth::authenticate_accept(q->fd, kHandshakeLabel, "accept the peer rank",
                                                Clock::now() + auth::handshake_timeout());
          q->done.store(true);
        });
        pending.push_back(std::move(p));
      }
    }
    reap();
  }
  // Whoever is still in the handshake loses: unblock its thread and drop it.
  for (auto& p : pending) ::shutdown(p->fd, SHUT_RDWR);
  for (auto& p : pending) {
    p->thread.join();
    std::fprintf(stderr, "p2p: dropped %s: it had not finished the handshake when the peer did\n",
                 p->address.c_str());
    ::close(p->fd);
  }
  return winner;
}

inline void nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ------------------------------------------------------------------- sizes

inline std::vector<size_t> sizes(size_t lo, size_t hi, bool quick) {
  std::vector<size_t> out;
  for (size_t s = lo; s <= hi; s *= 2) out.push_back(s);
  if (quick) {  // a handful: smallest, a few in between, largest
    std::vector<size_t> q;
    for (size_t i = 0; i < out.size(); i += 4) q.push_back(out[i]);
    if (q.back() != out.back()) q.push_back(out.back());
    out = q;
  }
  return out;
}

inline size_t window_for(size_t size) {
  return std::clamp<size_t>((64u << 20) / size, 1, 64);
}

// The measuring side (rank 0) picks an iteration count from a short trial so
// each measurement takes about `seconds`, and tells the peer.
inline uint64_t pick_iters(double trial_seconds, uint64_t trial_iters, double seconds, uint64_t lo,
                           uint64_t hi) {
  double per = trial_seconds / static_cast<double>(std::max<uint64_t>(trial_iters, 1));
  auto n = static_cast<uint64_t>(seconds / std::max(per, 1e-9));
  return std::clamp<uint64_t>(n, lo, hi);
}

inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Ping-pong timing: rank 0 times each round trip. One-way latency is half of
// it; we keep the mean (what osu_latency reports) and the median (robust to
// the preemptions of a shared machine).
struct Latency {
  double avg_us = 0;
  double p50_us = 0;
};

// Warm-up as osu_latency's: 1000 rounds up to 8 KiB, 10 above (the first
// size of a freshly started pair used to come out 2-3x slow after 20).
// With several kinds of round (--interleave: the socket reference and the
// transport), every iteration runs each kind once, in turn, and each kind
// gets its own figures: they share whatever the scheduler does meanwhile.
inline std::vector<Latency> measure_pingpongs(int rank, Oob& oob, const Options& o, size_t size,
                                              const std::vector<std::function<void()>>& rounds) {
  auto each = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      for (const auto& round : rounds) round();
    }
  };
  each(size <= 8192 ? 1000 : 10);
  const uint64_t trial = 20;
  uint64_t iters;
  if (rank == 0) {
    auto t0 = Clock::now();
    each(trial);
    iters = pick_iters(since(t0), trial, o.seconds, 20, 200000);
    oob.send(std::to_string(iters));
  } else {
    each(trial);
    iters = oob.recv_u64();
  }
  std::vector<std::vector<double>> rtt(rounds.size());
  for (auto& r : rtt) r.reserve(rank == 0 ? iters : 0);
  for (uint64_t i = 0; i < iters; ++i) {
    for (size_t k = 0; k < rounds.size(); ++k) {
      auto a = Clock::now();
      rounds[k]();
      if (rank == 0) rtt[k].push_back(std::chrono::duration<double>(Clock::now() - a).count());
    }
  }
  std::vector<Latency> out(rounds.size());
  if (rank != 0) return out;
  for (size_t k = 0; k < rounds.size(); ++k) {
    double sum = 0;
    for (double x : rtt[k]) sum += x;
    std::nth_element(rtt[k].begin(), rtt[k].begin() + rtt[k].size() / 2, rtt[k].end());
    out[k].avg_us = sum / static_cast<double>(iters) / 2 * 1e6;
    out[k].p50_us = rtt[k][rtt[k].size() / 2] / 2 * 1e6;
  }
  return out;
}

inline Latency measure_pingpong(int rank, Oob& oob, const Options& o, size_t size,
                                const std::function<void()>& one_round) {
  return measure_pingpongs(rank, oob, o, size, {one_round})[0];
}

// Both ranks run `run(windows)` in step: once to warm up, then a short trial
// from which rank 0 picks how many windows take about `seconds` (and tells the
// peer), then those. Returns MB/s on rank 0 (`window_bytes` per window), 0 on
// rank 1.
inline double measure_windows(int rank, Oob& oob, const Options& o, size_t window_bytes,
                              const std::function<void(uint64_t)>& run) {
  run(1);
  uint64_t windows;
  if (rank == 0) {
    auto t0 = Clock::now();
    run(2);
    windows = pick_iters(since(t0), 2, o.seconds, 3, 100000);
    oob.send(std::to_string(windows));
  } else {
    run(2);
    windows = oob.recv_u64();
  }
  auto t0 = Clock::now();
  run(windows);
  const double s = since(t0);
  return rank == 0 ? static_cast<double>(windows * window_bytes) / s / 1e6 : 0;
}

// ------------------------------------------------------ reference: sockets

struct Reference {
  int fd = -1;
  std::vector<uint8_t> buf;

  // One round trip of `size` bytes (rank 0 pings, rank 1 pongs).
  std::function<void()> round(int rank, size_t size) {
    buf.resize(std::max<size_t>(size, 1));
    return [this, rank, size] {
      if (rank == 0) {
        if (!write_all(fd, buf.data(), size) || !read_all(fd, buf.data(), size)) die("ref ping");
      } else {
        if (!read_all(fd, buf.data(), size) || !write_all(fd, buf.data(), size)) die("ref pong");
      }
    };
  }

  // One-way latency (rank 0).
  Latency latency(int rank, Oob& oob, size_t size, const Options& o) {
    return measure_pingpong(rank, oob, o, size, round(rank, size));
  }

  // Returns MB/s (rank 0).
  double bandwidth(int rank, Oob& oob, size_t size, const Options& o) {
    buf.resize(size);
    const size_t window = window_for(size);
    auto run = [&](uint64_t windows) {
      char ack = 0;
      for (uint64_t w = 0; w < windows; ++w) {
        if (rank == 0) {
          for (size_t i = 0; i < window; ++i) {
            if (!write_all(fd, buf.data(), size)) die("ref stream send");
          }
          if (!read_all(fd, &ack, 1)) die("ref stream ack");
        } else {
          for (size_t i = 0; i < window; ++i) {
            if (!read_all(fd, buf.data(), size)) die("ref stream recv");
          }
          if (!write_all(fd, &ack, 1)) die("ref stream ack");
        }
      }
    };
    return measure_windows(rank, oob, o, window * size, run);
  }
};

// ------------------------------------------------------ reference: memcpy

// Single-thread memcpy bandwidth in MB/s for `window` copies of `size` bytes,
// windows repeated for about `seconds` (rank 0 only; same buffers reused, as the
// transports' writes reuse theirs).
inline double memcpy_bandwidth(size_t size, size_t max_bytes, const Options& o) {
  static uint8_t* src = nullptr;
  static uint8_t* dst = nullptr;
  static size_t have = 0;
  if (have < max_bytes) {
    std::free(src);
    std::free(dst);
    src = static_cast<uint8_t*>(std::aligned_alloc(4096, max_bytes));
    dst = static_cast<uint8_t*>(std::aligned_alloc(4096, max_bytes));
    if (src == nullptr || dst == nullptr) die("memcpy reference: out of memory");
    std::memset(src, 7, max_bytes);
    std::memset(dst, 0, max_bytes);
    have = max_bytes;
  }
  const size_t window = window_for(size);
  auto run = [&](uint64_t windows) {
    for (uint64_t w = 0; w < windows; ++w) {
      for (size_t i = 0; i < window; ++i) {
        std::memcpy(dst, src, size);
        asm volatile("" : : "r"(dst) : "memory");  // the copy must happen
      }
    }
  };
  run(1);
  auto t0 = Clock::now();
  run(2);
  const uint64_t windows = pick_iters(since(t0), 2, o.seconds, 3, 1000000);
  t0 = Clock::now();
  run(windows);
  return static_cast<double>(windows * window * size) / since(t0) / 1e6;
}

// ------------------------------------------------------- rdmaflow transport

}  // namespace rdmaflow::bench
