// Helpers for the transport conformance suite: a per-rank Node
// (transport + channels to every peer), plain aligned buffers, byte patterns,
// blocking wrappers and a raw TCP socket for protocol attacks.
#pragma once

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/handshake.h"
#include "tests/support/backends.h"
#include "tests/support/process.h"
#include "transport/channel.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace rdmaflow::testing {

// How long a test waits for one operation, connection or notify. Under
// ThreadSanitizer every byte the tests fill or check is a call into it: the
// 256 MiB rows of WriteAndReadEverySizeByteForByte missed 20 s on a busy
// 2-core machine while the peer was still filling its pattern.
#if defined(__SANITIZE_THREAD__)
inline constexpr Millis kOpTimeout(120000);
#else
inline constexpr Millis kOpTimeout(20000);
#endif

// ------------------------------------------------------------------ memory

// Buffers die before the Node whose transport has them registered whenever a
// test declares them after it (most do) and returns early on a failed
// assertion: a peer's late write then landed in freed memory (a SIGSEGV of a
// ucx_tcp rank under ThreadSanitizer, after an earlier failure). So while any
// Node of this rank lives, a Buffer's memory is only released when the last
// Node has shut its transport down.
struct BufferLifetimes {
  int live_nodes = 0;
  std::vector<void*> deferred;

  static BufferLifetimes& get() {
    static BufferLifetimes l;
    return l;
  }
  void release(void* p) {
    if (live_nodes > 0) {
      deferred.push_back(p);
    } else {
      std::free(p);
    }
  }
  void node_gone() {
    if (--live_nodes > 0) return;
    for (void* p : deferred) std::free(p);
    deferred.clear();
  }
};

// Page-aligned plain heap memory (registered with the transport by the test).
struct Buffer {
  explicit Buffer(size_t n) : size(n) {
    size_t rounded = ((n == 0 ? 1 : n) + 4095) / 4096 * 4096;
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
  }
  ~Buffer() { BufferLifetimes::get().release(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* p;
  size_t size;
};

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deterministic bytes: word i of the pattern is mix64(seed * 2^32 + i).
inline void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
  const uint64_t base = seed << 32;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = mix64(base + i / 8);
    std::memcpy(p + i, &w, 8);
  }
  if (i < n) {
    uint64_t w = mix64(base + i / 8);
    std::memcpy(p + i, &w, n - i);
  }
}

// Index of the first byte that differs from the pattern, or -1.
inline int64_t check_pattern(const uint8_t* p, size_t n, uint64_t seed) {
  const uint64_t base = seed << 32;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = mix64(base + i / 8);
    if (std::memcmp(p + i, &w, 8) != 0) {
      for (size_t k = 0; k < 8; ++k) {
        if (p[i + k] != reinterpret_cast<const uint8_t*>(&w)[k]) return static_cast<int64_t>(i + k);
      }
    }
  }
  if (i < n) {
    uint64_t w = mix64(base + i / 8);
    for (size_t k = 0; i + k < n; ++k) {
      if (p[i + k] != reinterpret_cast<const uint8_t*>(&w)[k]) return static_cast<int64_t>(i + k);
    }
  }
  return -1;
}

inline uint64_t checksum(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// ------------------------------------------------------------------- keys

inline std::string key_bytes(const RemoteKey& k) {
  auto v = k.serialize();
  return std::string(v.begin(), v.end());
}

inline Result<RemoteKey> parse_key(const std::string& s) {
  return RemoteKey::deserialize(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

// Two binary strings in one (for one allgather round).
inline std::string join2(const std::string& a, const std::string& b) {
  return std::to_string(a.size()) + ":" + a + b;
}
inline std::pair<std::string, std::string> split2(const std::string& s) {
  size_t colon = s.find(':');
  size_t n = std::stoul(s.substr(0, colon));
  return {s.substr(colon + 1, n), s.substr(colon + 1 + n)};
}

// ------------------------------------------------------------------- node

// This rank's transport and a channel to every other rank.
struct Node {
  std::unique_ptr<Transport> transport;
  std::vector<std::shared_ptr<Channel>> peers;

  Node() { ++BufferLifetimes::get().live_nodes; }
  Node(const Node&) = delete;
  ~Node() {
    peers.clear();
    if (transport) transport->shutdown();
    transport.reset();
    BufferLifetimes::get().node_gone();  // no peer can reach this rank's buffers now
  }

  // Creates the transport; a backend that is not built or not viable here skips the rank.
  Status create(const BackendRow& b, int rank, int world, Exchange& ex,
                const std::string& ifname = "") {
    TransportConfig config;
    config.rank = rank;
    config.world_size = world;
    config.ifname = ifname;
    config.connect_timeout = Millis(20000);
    RDMAFLOW_ASSIGN_OR_RETURN(transport, make_row_transport(b, config, ex));
    return Status::ok();
  }

  // Creates the transport and connects every pair of ranks.
  Status connect_all(const BackendRow& b, int rank, int world, Exchange& ex,
                     const std::string& ifname = "") {
    RDMAFLOW_RETURN_IF_ERROR(create(b, rank, world, ex, ifname));
    RDMAFLOW_ASSIGN_OR_RETURN(peers, connect_mesh(*transport, rank, world, ex));
    return Status::ok();
  }

  // Registers a local source or destination (verbs needs its lkey; every
  // backend accepts registered memory, which is what real callers use).
  Status local(const Buffer& b) {
    return transport->register_memory(b.p, b.size == 0 ? 1 : b.size).status();
  }

  // Registers [p, p + n) and grants all of it.
  Result<RemoteKey> expose(void* p, size_t n) {
    RDMAFLOW_ASSIGN_OR_RETURN(RegionId id, transport->register_memory(p, n));
    (void)id;
    return transport->export_key(p, n);
  }
};

// The listener of the raw-peer tests (tcp_raw_test.cc, tests/verbs/raw_peer_test.cc):
// a transport listening with a 64 KiB region exposed (pattern 11) and a copy of
// what the region must still hold; its address and key go to every rank as
// join2(address, key).
struct RawPeerTarget {
  Node node;
  std::string address;
  Buffer region{1 << 16};
  Buffer expected{1 << 16};
  RemoteKey key;

  Status start(const BackendRow& b, int rank, int world, Exchange& ex);
  // Accepts the connection of a raw peer that claims rank `claimed`; the
  // first wait on it must fail, not time out, naming that rank.
  Result<std::shared_ptr<Channel>> accept_failed(int claimed);
};

// --------------------------------------------------------- blocking wrappers

inline Status write_sync(Channel& ch, const void* src, size_t len, const RemoteKey& key,
                         uint64_t offset, std::optional<uint64_t> notify,
                         Millis timeout = Millis(20000)) {
  Completion c;
  ch.write(src, len, key, offset, notify, c.callback(), timeout);
  return c.wait(timeout + Millis(5000), "write");
}

inline Status read_sync(Channel& ch, void* dst, size_t len, const RemoteKey& key, uint64_t offset,
                        Millis timeout = Millis(20000)) {
  Completion c;
  ch.read(dst, len, key, offset, c.callback(), timeout);
  return c.wait(timeout + Millis(5000), "read");
}

inline Status send_text(Channel& ch, const std::string& text, Millis timeout = Millis(20000)) {
  Completion c;
  ch.send_message(std::vector<uint8_t>(text.begin(), text.end()), c.callback(), timeout);
  return c.wait(timeout + Millis(5000), "send message");
}

inline Status expect_text(Channel& ch, const std::string& text, Millis timeout = Millis(20000)) {
  RDMAFLOW_ASSIGN_OR_RETURN(auto m, ch.inbox().recv_message(timeout));
  std::string got(m.begin(), m.end());
  if (got != text) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "expect message", ch.peer_rank(),
                          "expected '" + text + "', got '" + got + "'");
  }
  return Status::ok();
}

// Wraps callbacks and counts any that fire more than once.
struct OnceChecker {
  std::atomic<int> twice{0};
  Callback wrap(Callback cb) {
    auto fired = std::make_shared<std::atomic<bool>>(false);
    return [this, fired, cb = std::move(cb)](const Status& st) {
      if (fired->exchange(true)) {
        ++twice;
        return;
      }
      cb(st);
    };
  }
};

// ------------------------------------------------------------ raw sockets

inline bool ipv6_loopback_available() {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A plain blocking TCP client speaking raw bytes to a tcp transport.
struct RawConn {
  int fd = -1;
  ~RawConn() {
    if (fd >= 0) ::close(fd);
  }
  Status open(const std::string& address) {
    std::string s = address.substr(address.find("://") + 3);
    size_t colon = s.rfind(':');
    std::string host = s.substr(0, colon);
    int port = std::atoi(s.substr(colon + 1).c_str());
    sockaddr_storage ss{};
    socklen_t len;
    if (!host.empty() && host.front() == '[') {
      host = host.substr(1, host.size() - 2);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr);
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, host.c_str(), &a->sin_addr);
      len = sizeof(*a);
    }
    fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      return RDMAFLOW_ERROR(Code::kConnectionFailed, "raw connect", -1,
                            address + ": " + std::strerror(errno));
    }
    return Status::ok();
  }
  bool send(const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  // Whether everything sent was acknowledged by the peer's kernel (so it sits
  // in the peer's socket) within `timeout`: SIOCOUTQ, unsent plus unacknowledged.
  bool drained(Millis timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int queued = 0;
      if (::ioctl(fd, SIOCOUTQ, &queued) != 0) return false;
      if (queued == 0) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      ::usleep(1000);
    }
  }
  bool recv(void* p, size_t n, Millis timeout) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return false;
      ssize_t k = ::recv(fd, c, n, 0);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  // The job handshake, then the tcp hello: what a peer of this job that then
  // misbehaves would send.
  bool hello(int rank) {
    if (!auth::authenticate_connect(fd, "tcp", "raw connect", 0,
                                    std::chrono::steady_clock::now() + Millis(5000))
             .is_ok()) {
      return false;
    }
    tcp::Hello h;
    h.rank = rank;
    tcp::Hello reply;
    return send(&h, sizeof(h)) && recv(&reply, sizeof(reply), Millis(5000)) &&
           reply.magic == tcp::kHelloMagic;
  }
  // True when the other side closes the connection within the timeout.
  bool eof_within(Millis timeout) {
    char buf[4096];
    for (;;) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return false;
      ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
      if (k <= 0) return true;
    }
  }
};

inline Status RawPeerTarget::start(const BackendRow& b, int rank, int world, Exchange& ex) {
  RDMAFLOW_RETURN_IF_ERROR(node.create(b, rank, world, ex));
  RDMAFLOW_ASSIGN_OR_RETURN(address, node.transport->listen());
  fill_pattern(region.p, region.size, 11);
  std::memcpy(expected.p, region.p, region.size);
  RDMAFLOW_ASSIGN_OR_RETURN(key, node.expose(region.p, region.size));
  return ex.allgather(join2(address, key_bytes(key))).status();
}

// The raw peer's side of RawPeerTarget::start(): the target's address and key.
inline Result<std::pair<std::string, RemoteKey>> raw_target_of(Exchange& ex) {
  RDMAFLOW_ASSIGN_OR_RETURN(auto all, ex.allgather(""));
  auto [addr, key_text] = split2(all[0]);
  RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey key, parse_key(key_text));
  return std::make_pair(addr, key);
}

inline Result<std::shared_ptr<Channel>> RawPeerTarget::accept_failed(int claimed) {
  RDMAFLOW_ASSIGN_OR_RETURN(auto ch, node.transport->accept(claimed, kOpTimeout));
  auto n = ch->inbox().wait_notify(kOpTimeout);
  EXPECT_FALSE(n.is_ok()) << "a notify arrived from the raw peer claiming rank " << claimed;
  if (!n.is_ok()) {
    EXPECT_NE(n.status().code(), Code::kTimeout) << n.status().to_string();
    EXPECT_EQ(n.status().peer(), claimed);
  }
  EXPECT_FALSE(ch->error().is_ok());
  return ch;
}

// Two ranks over `b` with every address bound to `ip` (an IPv6 address): each
// reads the other's 1 MiB region byte for byte and writes 4 KiB back with notify 9.
inline RunResult run_over_ipv6(const BackendRow& b, const std::string& ip) {
  return run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(b, rank, world, ex, ip));
    RF_ASSIGN_OR_FAIL(std::string addr, node.transport->listen());
    EXPECT_NE(addr.find("[" + ip + "]"), std::string::npos) << addr;
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    Buffer region(1 << 20), back(1 << 20);
    RF_ASSERT_OK(node.local(back));
    fill_pattern(region.p, region.size, 60 + static_cast<uint64_t>(rank));
    RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(key_bytes(key)));
    RF_ASSIGN_OR_FAIL(RemoteKey peer_key, parse_key(all[static_cast<size_t>(1 - rank)]));
    RF_ASSERT_OK(read_sync(ch, back.p, back.size, peer_key, 0));
    EXPECT_EQ(check_pattern(back.p, back.size, 60 + static_cast<uint64_t>(1 - rank)), -1);
    RF_ASSERT_OK(write_sync(ch, back.p, 4096, peer_key, 0, 9));
    RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
    EXPECT_EQ(v, 9u);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
}

// The fixture of the conformance suite (conformance_test.cc and
// conformance_failure_test.cc), instantiated once over medium_rows().
class Conformance : public ::testing::TestWithParam<BackendRow> {
 protected:
  const BackendRow& backend() const { return GetParam(); }
  RunOptions opts(int seconds = 40) const {
    RunOptions o;
    o.timeout = Millis(seconds * 1000);
    return o;
  }
};

}  // namespace rdmaflow::testing
