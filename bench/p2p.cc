// p2p: point-to-point latency and bandwidth of each transport, each beside a
// plain-socket reference measured in the same run, between two processes.
//
//   p2p                        # forks its two processes; every available transport
//   p2p --transport tcp --quick --json
//   mpirun -n 2 p2p --rendezvous 10.0.0.1:29500   # or --rank R with the same flag
//
// Latency (osu_latency style): ping-pong of `size` bytes; each side writes with
// notify into the other's registered buffer and waits for the notify; one-way
// latency is half the round trip. Reference: blocking send()/recv() ping-pong
// on a plain TCP socket (TCP_NODELAY), no framework.
//
// Bandwidth (osu_bw style): windows of `window` writes of `size` bytes into the
// peer's registered buffer, each window waited for (a write completes when its
// data is in the peer's memory). Reference: the same bytes as blocking send()
// calls on a plain TCP socket, the receiver recv()ing them and answering one
// byte per window. For the shared-memory rows a second reference is measured
// in the same run: single-thread memcpy() of the same sizes and windows between
// two buffers of this process (what one core can move at best).
//
// Contenders: tcp; ucx_shm (UCX_TLS=posix,sysv,cma,self); ucx_tcp (UCX_TLS=tcp,self
// on lo); verbs (skipped with its reason where no RDMA device exists); ucx (UCX's
// own choice of transports).
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/selection/transport_select.h"
#include "tools/cli.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct Options {
  std::vector<std::string> transports;  // empty = every registered backend
  bool quick = false;
  bool json = false;
  bool spin = false;  // busy-wait for notifies instead of blocking
  int rank = -1;      // -1 = fork both processes here
  std::string rendezvous;
  std::string host = "127.0.0.1";  // rank 0's address for the reference socket
  size_t lat_min = 8, lat_max = 1 << 20;
  size_t bw_min = 1 << 10, bw_max = 256u << 20;
  double seconds = 0.25;  // measuring time per size and contender
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "p2p: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

void check(const Status& st, const char* what) {
  if (!st.is_ok()) die(std::string(what) + ": " + st.to_string());
}

// ------------------------------------------------------------ plain sockets

bool write_all(int fd, const void* p, size_t n) {
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

bool read_all(int fd, void* p, size_t n) {
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

int listen_on(const std::string& host, uint16_t port, uint16_t* bound) {
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

int connect_to(const std::string& host, uint16_t port, Millis timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) die("bad IPv4 address " + host);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    ::close(fd);
    if (Clock::now() > deadline) die("cannot connect to " + host + ":" + std::to_string(port));
    std::this_thread::sleep_for(Millis(50));
  }
}

int accept_one(int listen_fd) {
  int fd = ::accept(listen_fd, nullptr, nullptr);
  if (fd < 0) die(std::string("accept: ") + std::strerror(errno));
  return fd;
}

void nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ------------------------------------------------------------------- sizes

std::vector<size_t> sizes(size_t lo, size_t hi, bool quick) {
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

size_t window_for(size_t size) {
  return std::clamp<size_t>((64u << 20) / size, 1, 64);
}

// The measuring side (rank 0) picks an iteration count from a short trial so
// each measurement takes about `seconds`, and tells the peer.
uint64_t pick_iters(double trial_seconds, uint64_t trial_iters, double seconds, uint64_t lo,
                    uint64_t hi) {
  double per = trial_seconds / static_cast<double>(std::max<uint64_t>(trial_iters, 1));
  auto n = static_cast<uint64_t>(seconds / std::max(per, 1e-9));
  return std::clamp<uint64_t>(n, lo, hi);
}

double since(Clock::time_point t0) {
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
Latency measure_pingpong(int rank, Oob& oob, const Options& o, size_t size,
                         const std::function<void()>& one_round) {
  const uint64_t warmup = size <= 8192 ? 1000 : 10;
  for (uint64_t i = 0; i < warmup; ++i) one_round();
  const uint64_t trial = 20;
  uint64_t iters;
  if (rank == 0) {
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < trial; ++i) one_round();
    iters = pick_iters(since(t0), trial, o.seconds, 20, 200000);
    oob.send(std::to_string(iters));
  } else {
    for (uint64_t i = 0; i < trial; ++i) one_round();
    iters = oob.recv_u64();
  }
  std::vector<double> rtt;
  rtt.reserve(iters);
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) {
    auto a = Clock::now();
    one_round();
    if (rank == 0) rtt.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  double s = since(t0);
  Latency l;
  if (rank == 0) {
    std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
    l.avg_us = s / static_cast<double>(iters) / 2 * 1e6;
    l.p50_us = rtt[rtt.size() / 2] / 2 * 1e6;
  }
  return l;
}

// ------------------------------------------------------ reference: sockets

struct Reference {
  int fd = -1;
  std::vector<uint8_t> buf;

  // One-way latency (rank 0).
  Latency latency(int rank, Oob& oob, size_t size, const Options& o) {
    buf.resize(std::max<size_t>(size, 1));
    return measure_pingpong(rank, oob, o, size, [&] {
      if (rank == 0) {
        if (!write_all(fd, buf.data(), size) || !read_all(fd, buf.data(), size)) die("ref ping");
      } else {
        if (!read_all(fd, buf.data(), size) || !write_all(fd, buf.data(), size)) die("ref pong");
      }
    });
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
    double s = since(t0);
    return rank == 0 ? static_cast<double>(windows * window * size) / s / 1e6 : 0;
  }
};

// ------------------------------------------------------ reference: memcpy

// Single-thread memcpy bandwidth in MB/s for `window` copies of `size` bytes,
// windows repeated for about `seconds` (rank 0 only; same buffers reused, as the
// transports' writes reuse theirs).
double memcpy_bandwidth(size_t size, size_t max_bytes, const Options& o) {
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

struct Contender {
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Channel> channel;
  uint8_t* local = nullptr;  // registered; the peer writes here
  uint8_t* source = nullptr;
  size_t bytes = 0;
  RemoteKey peer_key;
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> failed{0};
  std::string first_error;
  std::mutex error_mu;

  ~Contender() {
    channel.reset();
    if (transport) transport->shutdown();
    std::free(local);
    std::free(source);
  }

  Callback counter() {
    return [this](const Status& st) {
      if (!st.is_ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (failed++ == 0) first_error = st.to_string();
      }
      completed.fetch_add(1, std::memory_order_release);
    };
  }
  void check_errors() {
    if (failed.load() > 0) die("transport operation failed: " + first_error);
  }

  uint64_t wait_notify(const Options& o) {
    if (o.spin) {
      auto deadline = Clock::now() + std::chrono::seconds(30);
      for (;;) {
        if (auto v = channel->inbox().poll_notify()) return *v;
        if (Clock::now() > deadline) die("timed out spinning for a notify");
      }
    }
    auto v = channel->inbox().wait_notify(Millis(30000));
    check(v.status(), "wait for notify");
    return *v;
  }
};

// A row of the report: a backend as the transport registry lists it, possibly
// pinned to one medium through the environment it is created in.
using Spec = TransportVariant;

// The registry's row named `name`; any other name is passed to make_transport()
// as it is, which names the backends this build has when it does not know it.
std::vector<Spec> expand(const std::string& name) {
  for (const Spec& v : transport_variants()) {
    if (v.label == name) return {v};
  }
  Spec unknown;
  unknown.label = unknown.backend = name;
  return {unknown};
}

// A row per medium of every backend built in.
std::vector<Spec> default_specs() {
  std::vector<Spec> out;
  for (const Spec& v : transport_variants()) {
    if (v.built && v.per_medium) out.push_back(v);
  }
  return out;
}

Result<std::unique_ptr<Transport>> create_in_env(const Spec& spec, const TransportConfig& config) {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const auto& [k, v] : spec.env) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  auto t = make_transport(spec.backend, config);
  for (const auto& [k, v] : saved) {
    if (v) {
      ::setenv(k.c_str(), v->c_str(), 1);
    } else {
      ::unsetenv(k.c_str());
    }
  }
  return t;
}

std::unique_ptr<Contender> setup(const Spec& spec, int rank, Oob& oob, size_t bytes,
                                 std::string* skip_reason) {
  auto c = std::make_unique<Contender>();
  TransportConfig config;
  config.rank = rank;
  config.world_size = 2;
  auto t = create_in_env(spec, config);
  // Both sides must agree on skipping.
  std::string mine = t.is_ok() ? "ok" : t.status().to_string();
  oob.send(mine);
  std::string theirs = oob.recv();
  if (mine != "ok" || theirs != "ok") {
    *skip_reason = mine != "ok" ? mine : "peer: " + theirs;
    return nullptr;
  }
  c->transport = std::move(t).value();
  auto address = c->transport->listen();
  check(address.status(), "listen");
  oob.send(*address);
  std::string peer_address = oob.recv();
  if (rank == 0) {
    auto ch = c->transport->connect(1, peer_address, Millis(30000));
    check(ch.status(), "connect");
    c->channel = *ch;
  } else {
    auto ch = c->transport->accept(0, Millis(30000));
    check(ch.status(), "accept");
    c->channel = *ch;
  }
  c->bytes = bytes;
  c->local = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  c->source = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  std::memset(c->local, 0, bytes);
  std::memset(c->source, 7, bytes);
  check(c->transport->register_memory(c->local, bytes).status(), "register");
  check(c->transport->register_memory(c->source, bytes).status(), "register");
  auto key = c->transport->export_key(c->local, bytes);
  check(key.status(), "export key");
  auto wire = key->serialize();
  oob.send(std::string(wire.begin(), wire.end()));
  std::string peer = oob.recv();
  auto pk = RemoteKey::deserialize(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(peer.data()), peer.size()));
  check(pk.status(), "peer key");
  c->peer_key = *pk;
  return c;
}

Latency transport_latency(Contender& c, int rank, Oob& oob, size_t size, const Options& o) {
  constexpr Millis kTimeout(30000);
  uint64_t issued = 0;
  uint64_t seq = 0;
  Latency l = measure_pingpong(rank, oob, o, size, [&] {
    if (rank == 0) {
      c.channel->write(c.source, size, c.peer_key, 0, seq++, c.counter(), kTimeout);
      ++issued;
      c.wait_notify(o);
    } else {
      c.wait_notify(o);
      c.channel->write(c.source, size, c.peer_key, 0, seq++, c.counter(), kTimeout);
      ++issued;
    }
  });
  // Let every write's completion arrive before the next size.
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (c.completed.load(std::memory_order_acquire) < issued && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  c.check_errors();
  c.completed = 0;
  oob.send("done");
  oob.recv();
  return l;
}

double transport_bandwidth(Contender& c, int rank, Oob& oob, size_t size, const Options& o) {
  constexpr Millis kTimeout(60000);
  const size_t window = window_for(size);
  auto run = [&](uint64_t windows) {
    for (uint64_t w = 0; w < windows; ++w) {
      CompletionGroup group;
      for (size_t i = 0; i < window; ++i) {
        c.channel->write(c.source, size, c.peer_key, 0, std::nullopt, group.add(), kTimeout);
      }
      check(group.wait(kTimeout + Millis(5000), "window of writes"), "bandwidth window");
    }
  };
  uint64_t windows = 0;
  if (rank == 0) {  // the writer; the peer's transport does the receiving on its own
    run(1);
    auto t0 = Clock::now();
    run(2);
    windows = pick_iters(since(t0), 2, o.seconds, 3, 100000);
    t0 = Clock::now();
    run(windows);
    double s = since(t0);
    oob.send("done");
    return static_cast<double>(windows * window * size) / s / 1e6;
  }
  oob.recv();
  return 0;
}

// ------------------------------------------------------------------- main

struct Row {
  size_t size;
  double value;
  double reference;
  double value_p50 = 0;
  double reference_p50 = 0;
  double memcpy = 0;  // MB/s of single-thread memcpy (bandwidth rows of shared-memory contenders)
};

std::string human(size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

int run(int rank, Oob& oob, const Options& o) {
  std::vector<Spec> specs;
  if (o.transports.empty()) {
    specs = default_specs();
  } else {
    for (const auto& n : o.transports) {
      for (auto& s : expand(n)) specs.push_back(std::move(s));
    }
  }
  // Plain-socket reference connection, set up once, to rank 0's host.
  Reference ref;
  if (rank == 0) {
    uint16_t port = 0;
    int lfd = listen_on(o.host, 0, &port);
    oob.send(std::to_string(port));
    ref.fd = accept_one(lfd);
    ::close(lfd);
  } else {
    ref.fd = connect_to(o.host, static_cast<uint16_t>(std::stoul(oob.recv())), Millis(30000));
  }
  nodelay(ref.fd);

  // What RDMAFLOW_TRANSPORT=auto picks for this pair, and why (both records
  // exchanged, so a two-host run reports the real pair).
  std::string auto_line;
  {
    TransportConfig tc;
    tc.rank = rank;
    tc.world_size = 2;
    LocalProbe probe = probe_transports("auto", tc);
    for (auto& t : probe.transports) t->shutdown();
    Bytes mine = probe.record.encode();
    oob.send(std::string(mine.begin(), mine.end()));
    std::string peer = oob.recv();
    auto theirs = RankCapabilities::decode(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(peer.data()), peer.size()));
    if (!theirs.is_ok()) {
      auto_line = "auto: the peer's capability record is malformed: " + theirs.status().reason();
    } else {
      auto d = rank == 0 ? decide_pair(0, probe.record, 1, *theirs)
                         : decide_pair(0, *theirs, 1, probe.record);
      auto_line = d.is_ok() ? "RDMAFLOW_TRANSPORT=auto picks " + d->transport + " for this pair (" +
                                  d->reason + ")"
                            : "RDMAFLOW_TRANSPORT=auto: " + d.status().reason();
    }
    if (rank == 0 && !o.json) std::printf("%s\n\n", auto_line.c_str());
  }

  const auto lat_sizes = sizes(o.lat_min, o.lat_max, o.quick);
  const auto bw_sizes = sizes(o.bw_min, o.bw_max, o.quick);
  const size_t max_bytes = std::max(lat_sizes.back(), bw_sizes.back());
  nlohmann::json report = nlohmann::json::array();

  for (const Spec& spec : specs) {
    const std::string& name = spec.label;
    std::string skip;
    auto c = setup(spec, rank, oob, max_bytes, &skip);
    if (!c) {
      if (rank == 0) {
        if (o.json) {
          report.push_back({{"transport", name}, {"skipped", skip}});
        } else {
          std::printf("transport %s: skipped (%s)\n", name.c_str(), skip.c_str());
        }
      }
      continue;
    }
    std::vector<Row> lat, bw;
    for (size_t s : lat_sizes) {
      Latency r = ref.latency(rank, oob, s, o);
      Latency t = transport_latency(*c, rank, oob, s, o);
      lat.push_back({s, t.avg_us, r.avg_us, t.p50_us, r.p50_us});
    }
    for (size_t s : bw_sizes) {
      double r = ref.bandwidth(rank, oob, s, o);
      double t = transport_bandwidth(*c, rank, oob, s, o);
      bw.push_back({s, t, r});
      if (spec.shared_memory && rank == 0) bw.back().memcpy = memcpy_bandwidth(s, max_bytes, o);
    }
    oob.send("next");
    oob.recv();
    if (rank != 0) continue;
    const char* busy = std::getenv("RDMAFLOW_TCP_BUSY_POLL");
    if (o.json) {
      nlohmann::json j;
      j["transport"] = name;
      for (const auto& [k, v] : spec.env) j["env"][k] = v;
      j["wait"] = o.spin ? "spin" : "block";
      j["busy_poll_us"] = busy ? std::atoi(busy) : 0;
      for (auto& r : lat) {
        j["latency_us"].push_back({{"size", r.size},
                                   {"transport", r.value},
                                   {"socket", r.reference},
                                   {"ratio", r.value / r.reference},
                                   {"transport_p50", r.value_p50},
                                   {"socket_p50", r.reference_p50},
                                   {"ratio_p50", r.value_p50 / r.reference_p50}});
      }
      for (auto& r : bw) {
        nlohmann::json row = {{"size", r.size},
                              {"transport", r.value},
                              {"socket", r.reference},
                              {"ratio", r.value / r.reference}};
        if (r.memcpy > 0) {
          row["memcpy"] = r.memcpy;
          row["ratio_memcpy"] = r.value / r.memcpy;
        }
        j["bandwidth_MBps"].push_back(row);
      }
      report.push_back(j);
      continue;
    }
    std::string env;
    for (const auto& [k, v] : spec.env) env += " " + k + "=" + v;
    const std::string where =
        o.rank >= 0 ? "2 ranks, rank 0 at " + o.host : std::string("2 processes over loopback");
    std::printf("transport: %s  (%s; notify wait: %s; RDMAFLOW_TCP_BUSY_POLL=%s%s)\n", name.c_str(),
                where.c_str(), o.spin ? "spin" : "block", busy ? busy : "0", env.c_str());
    std::printf("\nLatency in us, one-way = half round trip (osu_latency style)\n");
    std::printf("%10s %12s %12s %8s   %12s %12s %8s\n", "size", (name + " avg").c_str(),
                "socket avg", "ratio", (name + " p50").c_str(), "socket p50", "ratio");
    for (auto& r : lat) {
      std::printf("%10s %12.2f %12.2f %8.2f   %12.2f %12.2f %8.2f\n", human(r.size).c_str(),
                  r.value, r.reference, r.value / r.reference, r.value_p50, r.reference_p50,
                  r.value_p50 / r.reference_p50);
    }
    std::printf("\nBandwidth, windowed one-sided writes (osu_bw style)\n");
    std::printf("%10s %8s %14s %14s %8s", "size", "window", (name + " MB/s").c_str(), "socket MB/s",
                "ratio");
    if (spec.shared_memory) std::printf(" %14s %8s", "memcpy MB/s", "ratio");
    std::printf("\n");
    for (auto& r : bw) {
      std::printf("%10s %8zu %14.1f %14.1f %8.2f", human(r.size).c_str(), window_for(r.size),
                  r.value, r.reference, r.value / r.reference);
      if (spec.shared_memory) std::printf(" %14.1f %8.2f", r.memcpy, r.value / r.memcpy);
      std::printf("\n");
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (rank == 0 && o.json) {
    nlohmann::json out = {{"auto", auto_line}, {"rows", report}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  ::close(ref.fd);
  return 0;
}

// Returns the exit status when the command line says not to run (--help, or a
// bad command line).
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{
      "Point-to-point latency and bandwidth of each transport beside a plain-socket reference\n"
      "measured in the same run. Forks its two processes unless --rank (or OMPI_COMM_WORLD_RANK /\n"
      "PMI_RANK / PMIX_RANK) is given; then rank 0 listens on the rendezvous port and rank 1\n"
      "connects to it.",
      "p2p"};
  cli::configure(app);
  std::vector<std::string> transports;
  app.add_option("--transport", transports,
                 "tcp, ucx_shm, ucx_tcp, ucx, verbs or all; repeat for several")
      ->allow_extra_args(false)
      ->default_str("all: every backend built in");
  app.add_flag("--quick", o.quick, "a handful of sizes, 0.05 s each unless --seconds is given");
  app.add_flag("--json", o.json, "the report as JSON on stdout");
  app.add_flag("--spin", o.spin, "busy-wait for notifies instead of blocking");
  auto* seconds = app.add_option("--seconds", o.seconds, "measuring time per size and contender")
                      ->check(cli::at_least(0.001));
  cli::add_size(app, "--lat-min", o.lat_min, "smallest latency message");
  cli::add_size(app, "--lat-max", o.lat_max, "largest latency message");
  cli::add_size(app, "--bw-min", o.bw_min, "smallest bandwidth message");
  cli::add_size(app, "--bw-max", o.bw_max, "largest bandwidth message");
  app.add_option("--rank", o.rank, "this process's rank (0 or 1; others exit at once)")
      ->check(cli::at_least(0))
      ->default_str("fork both ranks here");
  app.add_option("--rendezvous", o.rendezvous, "HOST:PORT rank 0 listens on (with --rank)");
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  for (const auto& t : transports) {
    if (t != "all") o.transports.push_back(t);
  }
  if (o.quick && seconds->count() == 0) o.seconds = 0.05;
  if (o.lat_min == 0 || o.bw_min == 0 || o.lat_min > o.lat_max || o.bw_min > o.bw_max) {
    std::fprintf(stderr,
                 "p2p: sizes must be at least 1 byte and each minimum at most its maximum\n");
    return cli::kUsageError;
  }
  if (o.rank < 0) {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
      if (const char* r = std::getenv(v); r != nullptr && o.rank < 0) o.rank = std::atoi(r);
    }
  }
  if (!o.rendezvous.empty()) o.host = o.rendezvous.substr(0, o.rendezvous.rfind(':'));
  return std::nullopt;
}

}  // namespace
}  // namespace rdmaflow::bench

int main(int argc, char** argv) {
  using namespace rdmaflow::bench;
  Options o;
  if (auto exit_code = parse(argc, argv, o)) return *exit_code;
  Oob oob;
  if (o.rank >= 0) {
    if (o.rank > 1) return 0;  // only two ranks take part
    if (o.rendezvous.empty()) die("--rank needs --rendezvous HOST:PORT");
    size_t colon = o.rendezvous.rfind(':');
    std::string host = o.rendezvous.substr(0, colon);
    auto port = static_cast<uint16_t>(std::stoul(o.rendezvous.substr(colon + 1)));
    if (o.rank == 0) {
      uint16_t bound = 0;
      int lfd = listen_on(host, port, &bound);
      oob.fd = accept_one(lfd);
      ::close(lfd);
    } else {
      oob.fd = connect_to(host, port, Millis(60000));
    }
    return run(o.rank, oob, o);
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair failed");
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::close(sv[0]);
    oob.fd = sv[1];
    int rc = run(1, oob, o);
    std::fflush(stdout);
    std::_Exit(rc);
  }
  ::close(sv[1]);
  oob.fd = sv[0];
  int rc = run(0, oob, o);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "p2p: the peer process failed (status %d)\n", status);
    return 1;
  }
  return rc;
}
