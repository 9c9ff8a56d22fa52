// The rendezvous store: in-process and TCP, served by one real process with
// several client processes; timeouts, late servers, malformed requests.
#include "runtime/rendezvous/store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/handshake.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/rendezvous/tcp_store_protocol.h"
#include "tests/support/process.h"
#include "tests/support/text.h"
#include "tools/free_port.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using dev::free_port;
using testing::Exchange;
using testing::RankGroup;
using testing::run_ranks;
using testing::start_ranks;
using Clock = std::chrono::steady_clock;
namespace wire = store_wire;

std::unique_ptr<TcpStore> connect_or_die(const HostPort& hp, Millis timeout = 5000ms) {
  auto store = TcpStore::connect(hp, timeout, timeout);
  if (!store.is_ok()) {
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return nullptr;
  }
  return std::move(*store);
}

using testing::contains;

// A TcpStoreServer in a process of its own (the test process stays free of
// threads, so it can still fork), serving until stop().
class ServerProcess {
 public:
  explicit ServerProcess(int port = 0)
      : rank_(start_ranks(1, [port](int, int, Exchange& ex) -> int {
          auto server =
              TcpStoreServer::start(HostPort{"127.0.0.1", static_cast<uint16_t>(port)}, 64);
          RF_ASSERT_OK(server);
          RF_ASSERT_OK(ex.publish(std::to_string((*server)->address().port)));
          ex.wait_released();
          RF_ASSERT_OK(ex.publish(std::to_string((*server)->rejected_requests())));
          (*server)->stop();
          return 0;
        })) {
    port_ = std::stoi(rank_.published(0).value_or("-1"));
  }

  ~ServerProcess() { stop(); }

  int port() const { return port_; }
  HostPort address() const { return HostPort{"127.0.0.1", static_cast<uint16_t>(port_)}; }

  // Stops the server; returns its exit code (0 = healthy to the end).
  int stop() {
    if (!stopped_) {
      rank_.release(0);
      result_ = rank_.wait();
      stopped_ = true;
    }
    return result_.exit_codes[0];
  }
  // Requests the server refused, reported when it stopped.
  uint64_t rejected() const { return stopped_ ? std::stoull("0" + result_.published[0]) : 0; }

 private:
  RankGroup rank_;
  int port_ = -1;
  bool stopped_ = false;
  testing::RunResult result_;
};

// ---- address parsing ----

TEST(HostPort, ParsesIpv4Ipv6AndNames) {
  auto a = parse_host_port("127.0.0.1:29500", "X");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 29500);
  auto b = parse_host_port("[::1]:80", "X");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 80);
  EXPECT_EQ(b->to_string(), "[::1]:80");
  auto c = parse_host_port("node-7.cluster:1234", "X");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->host, "node-7.cluster");
}

TEST(HostPort, RejectsMalformedNamingTheVariable) {
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", ":29500", "127.0.0.1:http",
                          "127.0.0.1:70000", "::1:80", "[::1]80", "[::1:80", "[]:80", "host:-1"}) {
    auto r = parse_host_port(bad, "RDMAFLOW_RENDEZVOUS");
    EXPECT_FALSE(r.is_ok()) << "accepted '" << bad << "'";
    if (!r.is_ok()) {
      EXPECT_TRUE(contains(r.status().to_string(), "RDMAFLOW_RENDEZVOUS"))
          << r.status().to_string();
    }
  }
}

// ---- in-process and prefix stores ----

TEST(MemoryStore, SetGetWaitAddAcrossThreads) {
  auto store = std::make_shared<MemoryStore>(2000ms);
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    (void)store->set("late", to_bytes("value"));
  });
  auto v = store->get("late");
  writer.join();
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(as_string(*v), "value");
  EXPECT_EQ(*store->add("n", 2), 2);
  EXPECT_EQ(*store->add("n", -5), -3);
  EXPECT_EQ(as_string(*store->get("n")), "-3");
  EXPECT_TRUE(store->wait({"late", "n"}, 0ms).is_ok());

  auto missing = store->get("never", 30ms);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), Code::kTimeout);
  EXPECT_TRUE(contains(missing.status().to_string(), "'never'"));
  Status w = store->wait({"late", "x", "y"}, 30ms);
  EXPECT_EQ(w.code(), Code::kTimeout);
  EXPECT_TRUE(contains(w.to_string(), "'x', 'y' (2 of 3 missing)")) << w.to_string();
  EXPECT_EQ(store->add("late", 1).status().code(), Code::kInvalidArgument);
}

TEST(PrefixStore, NamespacesKeys) {
  auto base = std::make_shared<MemoryStore>(1000ms);
  PrefixStore a(base, "a"), b(base, "b");
  ASSERT_TRUE(a.set("k", to_bytes("in a")).is_ok());
  ASSERT_TRUE(b.set("k", to_bytes("in b")).is_ok());
  EXPECT_EQ(as_string(*a.get("k")), "in a");
  EXPECT_EQ(as_string(*b.get("k")), "in b");
  EXPECT_EQ(as_string(*base->get("a/k")), "in a");
  EXPECT_EQ(*a.add("c", 1), 1);
  EXPECT_EQ(*b.add("c", 1), 1);
  EXPECT_TRUE(a.wait({"k", "c"}, 0ms).is_ok());
  Status w = a.wait({"zzz"}, 10ms);
  EXPECT_TRUE(contains(w.to_string(), "'a/zzz'")) << w.to_string();
}

// ---- TCP store: one server process, several client processes ----

TEST(TcpStore, ServerProcessWithSeveralClientProcesses) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);
  constexpr int kClients = 5;
  auto run = run_ranks(kClients, [&](int i, int, Exchange&) -> int {
    auto store = connect_or_die(server.address());
    RF_ASSERT(store != nullptr);
    // Each client publishes a value, then reads everyone's.
    RF_ASSERT_OK(store->set("value/" + std::to_string(i), to_bytes("from " + std::to_string(i))));
    std::vector<std::string> keys;
    for (int j = 0; j < kClients; ++j) keys.push_back("value/" + std::to_string(j));
    RF_ASSERT_OK(store->wait(keys));
    for (int j = 0; j < kClients; ++j) {
      auto v = store->get(keys[j]);
      RF_ASSERT_OK(v);
      RF_ASSERT(as_string(*v) == "from " + std::to_string(j));
    }
    // A counter barrier, twice.
    for (int round = 0; round < 2; ++round) {
      const std::string key = "arrived/" + std::to_string(round);
      auto n = store->add(key, 1);
      RF_ASSERT_OK(n);
      RF_ASSERT(*n >= 1 && *n <= kClients);
      if (*n == kClients) RF_ASSERT_OK(store->set(key + "/done", to_bytes("")));
      RF_ASSERT_OK(store->wait({key + "/done"}));
    }
    // Big values go through intact.
    if (i == 0) {
      Bytes big(3 << 20);
      for (size_t k = 0; k < big.size(); ++k) big[k] = static_cast<uint8_t>(k * 7);
      RF_ASSERT_OK(store->set("big", big));
    }
    auto big = store->get("big");
    RF_ASSERT_OK(big);
    RF_ASSERT(big->size() == (3u << 20) && (*big)[12345] == static_cast<uint8_t>(12345 * 7));
    return 0;
  });
  RF_EXPECT_RUN_OK(run);

  auto store = connect_or_die(server.address());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->add("arrived/0", 0), kClients);
  EXPECT_EQ(as_string(*store->get("arrived/1")), std::to_string(kClients));
  store.reset();
  EXPECT_EQ(server.stop(), 0);
  EXPECT_EQ(server.rejected(), 0u);
}

TEST(TcpStore, GetWaitsForAnotherProcessToSet) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);
  RankGroup child = start_ranks(1, [&](int, int, Exchange&) -> int {
    auto store = connect_or_die(server.address());
    RF_ASSERT(store != nullptr);
    RF_ASSERT_OK(store->get("parent/ready"));  // the parent's get is being issued now
    std::this_thread::sleep_for(100ms);
    RF_ASSERT_OK(store->set("later", to_bytes("here")));
    return 0;
  });
  auto store = connect_or_die(server.address());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set("parent/ready", to_bytes("")).is_ok());
  const auto t0 = Clock::now();
  auto v = store->get("later", 10000ms);  // parked on the server until the child sets it
  const auto waited = Clock::now() - t0;
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(as_string(*v), "here");
  EXPECT_LT(waited, 5000ms);
  RF_EXPECT_RUN_OK(child.wait());
}

TEST(TcpStore, TimesOutWhenAKeyNeverAppears) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);
  auto store = connect_or_die(server.address());
  ASSERT_NE(store, nullptr);
  const std::string where = "127.0.0.1:" + std::to_string(server.port());

  auto t0 = Clock::now();
  auto v = store->get("missing/key", 200ms);
  auto waited = Clock::now() - t0;
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), Code::kTimeout);
  EXPECT_TRUE(contains(v.status().to_string(), "'missing/key'")) << v.status().to_string();
  EXPECT_TRUE(contains(v.status().to_string(), where)) << v.status().to_string();
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 3000ms);

  ASSERT_TRUE(store->set("present", to_bytes("x")).is_ok());
  Status w = store->wait({"present", "absent/1", "absent/2"}, 100ms);
  EXPECT_EQ(w.code(), Code::kTimeout);
  EXPECT_TRUE(contains(w.to_string(), "'absent/1', 'absent/2' (2 of 3 missing)")) << w.to_string();
  EXPECT_TRUE(contains(w.to_string(), where)) << w.to_string();

  // The default timeout applies when none is given.
  auto short_default = TcpStore::connect(server.address(), 1000ms, 150ms);
  ASSERT_TRUE(short_default.is_ok());
  t0 = Clock::now();
  EXPECT_EQ((*short_default)->get("missing/key").status().code(), Code::kTimeout);
  EXPECT_LT(Clock::now() - t0, 3000ms);

  // The connection is still good after timeouts.
  auto again = store->get("present", 100ms);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(as_string(*again), "x");
  // A value that is not a counter cannot be added to.
  auto bad_add = store->add("present", 1);
  EXPECT_EQ(bad_add.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(bad_add.status().to_string(), "not a counter"))
      << bad_add.status().to_string();
  short_default->reset();
  store.reset();
  EXPECT_EQ(server.stop(), 0);
}

TEST(TcpStore, ClientRetriesUntilTheServerIsUp) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const HostPort hp{"127.0.0.1", static_cast<uint16_t>(port)};
  RankGroup clients = start_ranks(2, [&](int i, int, Exchange&) -> int {
    auto store = connect_or_die(hp, 10000ms);  // nobody listens yet
    RF_ASSERT(store != nullptr);
    RF_ASSERT_OK(store->set("early/" + std::to_string(i), to_bytes("bird")));
    return 0;
  });
  std::this_thread::sleep_for(300ms);
  ServerProcess server(port);
  ASSERT_EQ(server.port(), port);
  RF_EXPECT_RUN_OK(clients.wait());
  auto store = connect_or_die(hp);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->wait({"early/0", "early/1"}, 1000ms).is_ok());
}

TEST(TcpStore, ConnectGivesUpAfterItsTimeoutNamingTheAddress) {
  const int port = free_port();
  const auto t0 = Clock::now();
  auto store = TcpStore::connect(HostPort{"127.0.0.1", static_cast<uint16_t>(port)}, 250ms, 250ms);
  const auto waited = Clock::now() - t0;
  ASSERT_FALSE(store.is_ok());
  EXPECT_EQ(store.status().code(), Code::kConnectionFailed);
  EXPECT_TRUE(contains(store.status().to_string(), "127.0.0.1:" + std::to_string(port)))
      << store.status().to_string();
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 1500ms);
}

TEST(TcpStore, ServerStopsOnlyAfterEveryGoodbye) {
  // In-process server here: this test forks nothing.
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 2);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  auto a = connect_or_die((*server)->address());
  auto b = connect_or_die((*server)->address());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->goodbye(0).is_ok());
  Status st = (*server)->wait_for_goodbyes(100ms);
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_TRUE(contains(st.to_string(), "ranks 1 did not say goodbye")) << st.to_string();
  // Open connections are still served while it waits (a late reader).
  ASSERT_TRUE(a->set("k", to_bytes("v")).is_ok());
  EXPECT_EQ(as_string(*b->get("k", 500ms)), "v");
  ASSERT_TRUE(b->goodbye(1).is_ok());
  EXPECT_TRUE((*server)->wait_for_goodbyes(1000ms).is_ok());
  EXPECT_EQ(b->goodbye(7).code(), Code::kInvalidArgument);  // no such rank
  (*server)->stop();
  auto after = a->get("k", 300ms);
  EXPECT_FALSE(after.is_ok());
}

// ---- malformed bytes from a raw socket ----

int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // A client of this job that then misbehaves: it passes the handshake first.
  if (!auth::authenticate_connect(fd, "store", "raw connect", 0,
                                  std::chrono::steady_clock::now() + 5000ms)
           .is_ok()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const Bytes& b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads one reply frame; nullopt on EOF, error or timeout.
std::optional<Bytes> read_reply(int fd) {
  auto read_n = [&](uint8_t* p, size_t n) {
    size_t off = 0;
    while (off < n) {
      ssize_t r = ::recv(fd, p + off, n - off, 0);
      if (r <= 0) return false;
      off += static_cast<size_t>(r);
    }
    return true;
  };
  uint32_t len = 0;
  if (!read_n(reinterpret_cast<uint8_t*>(&len), 4) || len > (1u << 20)) return std::nullopt;
  Bytes body(len);
  if (!read_n(body.data(), len)) return std::nullopt;
  return body;
}

Bytes frame_of(const Bytes& body) {
  ByteWriter w;
  w.raw(body.data(), body.size());
  return w.frame();
}

TEST(TcpStore, MalformedRequestsGetAnErrorAndNeverCrashTheServer) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);

  struct Case {
    const char* what;
    Bytes bytes;        // sent as is
    bool expect_error;  // a kError reply follows
  };
  auto body = [](std::initializer_list<uint8_t> b) { return frame_of(Bytes(b)); };
  ByteWriter huge_key;
  huge_key.u8(1).u32(1u << 30);  // key length far beyond the frame
  ByteWriter wait_many;
  wait_many.u8(3).u32(10).u32(0xFFFFFFFF);
  ByteWriter set_trailing;
  set_trailing.u8(1).str("k").str("v").u8(0);
  ByteWriter bye_bad_rank;
  bye_bad_rank.u8(5).i32(-3);
  std::vector<Case> cases = {
      {"empty frame", body({}), true},
      {"unknown op", body({0x77, 1, 2, 3}), true},
      {"op zero", body({0}), true},
      {"truncated set", body({1, 5, 0, 0, 0, 'a'}), true},
      {"key length beyond frame", frame_of(huge_key.body()), true},
      {"wait with 4 billion keys", frame_of(wait_many.body()), true},
      {"set with trailing bytes", frame_of(set_trailing.body()), true},
      {"truncated add", body({4, 1, 0, 0, 0, 'k', 1, 2}), true},
      {"truncated get", body({2, 10, 0}), true},
      {"goodbye from a negative rank", frame_of(bye_bad_rank.body()), true},
  };
  // One connection for all of them: after each refusal the connection is still usable.
  int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  for (const auto& c : cases) {
    ASSERT_TRUE(send_all(fd, c.bytes)) << c.what;
    auto reply = read_reply(fd);
    ASSERT_TRUE(reply.has_value()) << c.what << ": no reply";
    ASSERT_FALSE(reply->empty()) << c.what;
    EXPECT_EQ((*reply)[0], static_cast<uint8_t>(wire::Reply::kError)) << c.what;
    EXPECT_GT(reply->size(), 1u) << c.what << ": the error has no message";
  }
  // A valid request on the same connection still works.
  ByteWriter set_ok;
  set_ok.u8(1).str("after/garbage").str("fine");
  ASSERT_TRUE(send_all(fd, set_ok.frame()));
  auto ok = read_reply(fd);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ((*ok)[0], static_cast<uint8_t>(wire::Reply::kOk));
  ::close(fd);

  // An oversized frame is refused and the connection closed.
  fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  uint32_t too_big = wire::kMaxFrameBytes + 1;
  Bytes hdr(4);
  std::memcpy(hdr.data(), &too_big, 4);
  ASSERT_TRUE(send_all(fd, hdr));
  auto refused = read_reply(fd);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ((*refused)[0], static_cast<uint8_t>(wire::Reply::kError));
  EXPECT_FALSE(read_reply(fd).has_value());  // closed
  ::close(fd);

  // Random garbage, half frames and abrupt disconnects from several processes.
  auto run = run_ranks(4, [&](int i, int, Exchange&) -> int {
    uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
    for (int round = 0; round < 20; ++round) {
      int c = raw_connect(server.port());
      RF_ASSERT(c >= 0);
      Bytes junk(1 + round * 13 % 200);
      for (auto& b : junk) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b = static_cast<uint8_t>(x);
      }
      if (round % 3 == 0 && junk.size() >= 5) {
        // A plausible length prefix that promises more than is ever sent.
        uint32_t len = static_cast<uint32_t>(junk.size()) + 10;
        std::memcpy(junk.data(), &len, 4);
      }
      send_all(c, junk);
      ::close(c);  // often mid-frame
    }
    return 0;
  });
  RF_EXPECT_RUN_OK(run);

  // The server still serves a proper client.
  auto store = connect_or_die(server.address());
  ASSERT_NE(store, nullptr);
  auto v = store->get("after/garbage", 1000ms);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(as_string(*v), "fine");
  store.reset();
  EXPECT_EQ(server.stop(), 0);  // exited normally, no crash
  EXPECT_GE(server.rejected(), cases.size() + 1);
}

// The store's limits lowered through their knobs (docs/configuration.md, "Limits
// on what peers send"): a server in its own process refuses a long key (the
// connection stays usable) and an oversized frame (then closes), each reply naming
// the knob; a client with the same limits refuses locally.
TEST(TcpStore, LimitsFromTheEnvironmentAreEnforced) {
  ::setenv("RDMAFLOW_STORE_MAX_FRAME_BYTES", "1024", 1);
  ::setenv("RDMAFLOW_STORE_MAX_KEY_BYTES", "16", 1);
  ServerProcess server;  // reads them when it starts
  auto client = connect_or_die(server.address());
  ::unsetenv("RDMAFLOW_STORE_MAX_FRAME_BYTES");
  ::unsetenv("RDMAFLOW_STORE_MAX_KEY_BYTES");
  ASSERT_GT(server.port(), 0);
  ASSERT_NE(client, nullptr);

  int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  // Sends a set of `key` = `value`; the reply's status and text ("" for kOk).
  auto set = [fd](const std::string& key, const std::string& value) {
    ByteWriter w;
    w.u8(static_cast<uint8_t>(wire::Op::kSet)).str(key).str(value);
    auto reply = send_all(fd, frame_of(w.body())) ? read_reply(fd) : std::nullopt;
    if (!reply || reply->empty()) return std::make_pair(-1, std::string("no reply"));
    return std::make_pair(int{(*reply)[0]}, std::string(reply->begin() + 1, reply->end()));
  };
  const int error = static_cast<int>(wire::Reply::kError);
  auto [status, text] = set(std::string(32, 'k'), "v");
  EXPECT_EQ(status, error);
  EXPECT_TRUE(contains(text, "RDMAFLOW_STORE_MAX_KEY_BYTES=16")) << text;
  EXPECT_EQ(set("ok", "v").first, static_cast<int>(wire::Reply::kOk));  // still usable
  // 2 KiB: far below the built-in 64 MiB, over the knob.
  std::tie(status, text) = set("big", std::string(2048, 'v'));
  EXPECT_EQ(status, error);
  EXPECT_TRUE(contains(text, "RDMAFLOW_STORE_MAX_FRAME_BYTES=1024")) << text;
  EXPECT_FALSE(read_reply(fd).has_value());  // closed
  ::close(fd);

  Status st = client->set("a-key-longer-than-16", to_bytes("v"), 1000ms);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(st.reason(), "RDMAFLOW_STORE_MAX_KEY_BYTES=16")) << st.reason();
  st = client->set("k", Bytes(4096, 1), 1000ms);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(st.reason(), "RDMAFLOW_STORE_MAX_FRAME_BYTES=1024")) << st.reason();
  client.reset();
  EXPECT_EQ(server.stop(), 0);
  EXPECT_GE(server.rejected(), 2u);
}

}  // namespace
}  // namespace rdmaflow
