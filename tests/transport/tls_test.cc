// RDMAFLOW_TLS=1 (common/tls.h, docs/security.md): the tcp transport and the
// rendezvous store over TLS with a key derived from the job secret. What travels
// on the wire is not the plain text; a rank with TLS on only one side, or with
// another job secret, is refused with an error that says so, within the
// timeout; TLS without a job secret is refused when the transport is created.
// The data path's correctness over TLS is the conformance suite's tcp rows
// (ctest conformance.tcp_tls). Real processes, real sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/rendezvous/tcp_store.h"
#include "tests/support/process.h"
#include "transport/transport.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using testing::Exchange;
using testing::run_ranks;

constexpr const char* kJobSecret = "tls-test-job-secret-0123456789abcdef";
// Sent in a message: must not be seen in the clear between the ranks.
constexpr const char* kPlainText = "the quick brown fox sends a tensor over tcp";

void setup_rank(int rank, bool tls, const char* secret = kJobSecret) {
  const std::string dir =
      "/tmp/rdmaflow-tls-test-" + std::to_string(::getpid()) + "-" + std::to_string(rank);
  ::mkdir(dir.c_str(), 0700);
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  ::setenv("RDMAFLOW_JOB_SECRET", secret, 1);
  ::setenv("RDMAFLOW_TLS", tls ? "1" : "0", 1);
}

Result<std::unique_ptr<Transport>> tcp_transport(int rank) {
  TransportConfig cfg;
  cfg.rank = rank;
  cfg.world_size = 2;
  return make_transport("tcp", cfg);
}

// Forwards one connection from a port of its own to `to_port`, recording the bytes
// that go through (a wiretap between the ranks).
class Tap {
 public:
  explicit Tap(uint16_t to_port) : to_port_(to_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_, 1);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Tap() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  std::string seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void run() {
    pollfd l{listen_, POLLIN, 0};
    while (!stop_ && ::poll(&l, 1, 50) == 0) {
    }
    if (stop_) return;
    int in = ::accept(listen_, nullptr, nullptr);
    int out = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(to_port_);
    if (in < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          stop_ = true;
          break;
        }
        ::send(p[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
        std::lock_guard<std::mutex> lock(mu_);
        seen_.append(buf, static_cast<size_t>(n));
      }
    }
    ::close(in);
    ::close(out);
  }

  uint16_t to_port_;
  uint16_t port_ = 0;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string seen_;
};

// The plain text as a message; its receipt.
Status send_text(Channel& ch) {
  const std::string text = kPlainText;
  Completion sent;
  ch.send_message(std::vector<uint8_t>(text.begin(), text.end()), sent.callback(), 10000ms);
  return sent.wait(10000ms);
}

bool received_text(Channel& ch) {
  auto msg = ch.inbox().recv_message(10000ms);
  return msg.is_ok() && std::string(msg->begin(), msg->end()) == kPlainText;
}

uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// A message and a write with notify through a wiretap: both arrive, and the tap
// saw bytes, but never the plain text (with TLS off the same run would show it).
void message_through_tap(bool tls) {
  auto r = run_ranks(2, [tls](int rank, int, Exchange& ex) {
    setup_rank(rank, tls);
    RF_ASSIGN_OR_FAIL(auto t, tcp_transport(rank));
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(std::string addr, t->listen());
      RF_ASSERT_OK(ex.allgather(addr));
      RF_ASSIGN_OR_FAIL(auto ch, t->accept(1, 10000ms));
      EXPECT_TRUE(received_text(*ch));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    Tap tap(port_of(all[0]));
    RF_ASSIGN_OR_FAIL(auto ch,
                      t->connect(0, "tcp://127.0.0.1:" + std::to_string(tap.port()), 10000ms));
    RF_ASSERT_OK(send_text(*ch));
    RF_ASSERT_OK(ex.barrier());
    const std::string seen = tap.seen(), text = kPlainText;
    EXPECT_GT(seen.size(), text.size());
    EXPECT_EQ(seen.find(text) != std::string::npos, !tls)
        << (tls ? "the plain text crossed the wire under RDMAFLOW_TLS=1"
                : "the tap missed the plain text: it proves nothing");
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(Tls, TheWireCarriesNoPlainText) {
  message_through_tap(true);
}

TEST(Tls, TheTapSeesPlainTextWithoutTls) {
  message_through_tap(false);
}

// Rank 0 listens with `tls0`; rank 1 connects with `tls1` and `secret1`: refused,
// on both sides, before the timeout, with a reason containing `expect`.
void refused(bool tls0, bool tls1, const char* secret1, const std::string& expect) {
  auto r = run_ranks(2, [&](int rank, int, Exchange& ex) {
    setup_rank(rank, rank == 0 ? tls0 : tls1, rank == 0 ? kJobSecret : secret1);
    RF_ASSIGN_OR_FAIL(auto t, tcp_transport(rank));
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(std::string addr, t->listen());
      RF_ASSERT_OK(ex.allgather(addr));
      auto ch = t->accept(1, 2000ms);
      EXPECT_FALSE(ch.is_ok()) << "a mismatched peer got a channel";
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    const auto start = std::chrono::steady_clock::now();
    auto ch = t->connect(0, all[0], 5000ms);
    const auto took = std::chrono::steady_clock::now() - start;
    RF_ASSERT(!ch.is_ok());
    const std::string error = ch.status().to_string();
    EXPECT_EQ(ch.status().code(), Code::kUnauthenticated) << error;
    EXPECT_NE(error.find(expect), std::string::npos) << error;
    EXPECT_NE(error.find("127.0.0.1:"), std::string::npos) << "names no peer: " << error;
    EXPECT_LT(took, 5000ms) << "waited out the timeout instead of failing: " << error;
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(Tls, AConnectorWithoutTlsIsToldTheListenerWantsIt) {
  refused(true, false, kJobSecret, "runs with RDMAFLOW_TLS=1 and the other does not");
}

TEST(Tls, AConnectorWithTlsIsRefusedByAListenerWithout) {
  refused(false, true, kJobSecret, "RDMAFLOW_TLS=1");
}

TEST(Tls, AnotherJobSecretFailsTheTlsHandshake) {
  refused(true, true, "another-job-secret-0123456789abcdef", "the same job secret");
}

TEST(Tls, TlsWithoutAJobSecretIsAConfigurationError) {
  auto r = run_ranks(1, [](int rank, int, Exchange&) {
    setup_rank(rank, true);
    ::unsetenv("RDMAFLOW_JOB_SECRET");  // only the per-user host secret
    auto t = tcp_transport(rank);
    RF_ASSERT(!t.is_ok());
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(t.status().reason().find("RDMAFLOW_JOB_SECRET_FILE"), std::string::npos)
        << t.status().to_string();
    auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 1);
    EXPECT_FALSE(server.is_ok()) << "the store served TLS without a key";
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// The store under TLS: a TLS client is served; a plain client and one with another
// secret are refused with errors that say why.
TEST(Tls, TheStoreServesTlsClientsAndRefusesOthers) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    setup_rank(rank, true);
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(auto server, TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 1));
      RF_ASSERT_OK(ex.allgather(std::to_string(server->address().port)));
      RF_ASSIGN_OR_FAIL(auto store, TcpStore::connect(server->address(), 5000ms, 5000ms));
      RF_ASSERT_OK(store->set("k", std::vector<uint8_t>(100000, 7)));
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    const HostPort at{"127.0.0.1", static_cast<uint16_t>(std::stoi(all[0]))};
    RF_ASSERT_OK(ex.barrier());
    RF_ASSIGN_OR_FAIL(auto store, TcpStore::connect(at, 5000ms, 5000ms));
    RF_ASSIGN_OR_FAIL(auto v, store->get("k", 5000ms));
    EXPECT_EQ(v, std::vector<uint8_t>(100000, 7));

    ::setenv("RDMAFLOW_TLS", "0", 1);
    auto plain = TcpStore::connect(at, 3000ms, 3000ms);
    RF_ASSERT(!plain.is_ok());
    EXPECT_EQ(plain.status().code(), Code::kUnauthenticated) << plain.status().to_string();
    EXPECT_NE(plain.status().reason().find("RDMAFLOW_TLS=1"), std::string::npos)
        << plain.status().to_string();

    ::setenv("RDMAFLOW_TLS", "1", 1);
    ::setenv("RDMAFLOW_JOB_SECRET", "another-job-secret-0123456789abcdef", 1);
    auto wrong = TcpStore::connect(at, 3000ms, 3000ms);
    RF_ASSERT(!wrong.is_ok());
    EXPECT_EQ(wrong.status().code(), Code::kUnauthenticated) << wrong.status().to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A CA and a certificate it signed, made with the openssl tool into `dir`:
// ca.pem, node.pem, node.key.
bool make_certificates(const std::string& dir, const std::string& name) {
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  const std::string cmd =
      "set -e; mkdir -p " + dir + "; cd " + dir + "; exec >/dev/null 2>&1; " + "openssl req -x509" +
      ec + "-keyout ca.key -out ca.pem -days 1 -subj /CN=" + name + "-ca; openssl req" + ec +
      "-keyout node.key -out node.csr -subj /CN=" + name +
      "; openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out node.pem -days 1";
  return std::system(cmd.c_str()) == 0;
}

void use_certificates(const std::string& dir) {
  ::setenv("RDMAFLOW_TLS_CERT", (dir + "/node.pem").c_str(), 1);
  ::setenv("RDMAFLOW_TLS_KEY", (dir + "/node.key").c_str(), 1);
  ::setenv("RDMAFLOW_TLS_CA", (dir + "/ca.pem").c_str(), 1);
}

// Certificates instead of the job secret: two ranks with certificates of the job's
// CA talk (no job secret configured); a rank whose certificate another CA signed is
// refused on both sides.
TEST(Tls, CertificatesOfTheJobsCaAdmitAndOthersAreRefused) {
  const std::string job = "/tmp/rdmaflow-tls-certs-" + std::to_string(::getpid());
  if (!make_certificates(job + "/job", "job") || !make_certificates(job + "/other", "other")) {
    GTEST_SKIP() << "the openssl tool could not make test certificates";
  }
  auto r = run_ranks(3, [&](int rank, int, Exchange& ex) {
    setup_rank(rank, true);
    ::unsetenv("RDMAFLOW_JOB_SECRET");            // certificates need none; the job handshake
    ::setenv("XDG_RUNTIME_DIR", job.c_str(), 1);  // inside runs on the shared host secret
    use_certificates(job + (rank == 2 ? "/other" : "/job"));
    TransportConfig cfg;
    cfg.rank = rank;
    cfg.world_size = 3;
    RF_ASSIGN_OR_FAIL(auto t, make_transport("tcp", cfg));
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(std::string addr, t->listen());
      RF_ASSERT_OK(ex.allgather(addr));
      RF_ASSERT_OK(ex.barrier());  // rank 2 was refused
      EXPECT_FALSE(t->accept(2, 200ms).is_ok()) << "a certificate of another CA got a channel";
      RF_ASSIGN_OR_FAIL(auto ch, t->accept(1, 10000ms));
      EXPECT_TRUE(received_text(*ch));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    if (rank == 2) {
      auto ch = t->connect(0, all[0], 5000ms);
      RF_ASSERT(!ch.is_ok());
      EXPECT_EQ(ch.status().code(), Code::kUnauthenticated) << ch.status().to_string();
      EXPECT_NE(ch.status().reason().find("certificate"), std::string::npos)
          << ch.status().to_string();
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSERT_OK(ex.barrier());
    RF_ASSIGN_OR_FAIL(auto ch, t->connect(0, all[0], 10000ms));
    RF_ASSERT_OK(send_text(*ch));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
  std::system(("rm -rf " + job).c_str());
}

// A TLS client meeting a store without TLS fails at once, saying so.
TEST(Tls, APlainStoreRefusesATlsClient) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    setup_rank(rank, rank == 1);
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(auto server, TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 1));
      RF_ASSERT_OK(ex.allgather(std::to_string(server->address().port)));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    const HostPort at{"127.0.0.1", static_cast<uint16_t>(std::stoi(all[0]))};
    const auto start = std::chrono::steady_clock::now();
    auto store = TcpStore::connect(at, 5000ms, 5000ms);
    RF_ASSERT(!store.is_ok());
    EXPECT_EQ(store.status().code(), Code::kUnauthenticated) << store.status().to_string();
    EXPECT_NE(store.status().reason().find("RDMAFLOW_TLS=1"), std::string::npos)
        << store.status().to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5000ms);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow
