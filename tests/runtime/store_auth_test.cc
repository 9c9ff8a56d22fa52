// The rendezvous store's door (docs/security.md): a client without the job secret,
// or with a wrong one, is refused and stores nothing; an idle stray connection
// neither blocks the real clients nor outlives RDMAFLOW_AUTH_TIMEOUT_MS; beyond
// RDMAFLOW_AUTH_PENDING_MAX connections in the handshake, more are closed at once.
// Real processes, real sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/rendezvous/tcp_store.h"
#include "tests/support/process.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using testing::Exchange;
using testing::run_ranks;

constexpr const char* kJobSecret = "store-auth-test-secret-0123456789";

void use_scratch_host_secret(int rank) {
  const std::string dir =
      "/tmp/rdmaflow-store-auth-" + std::to_string(::getpid()) + "-" + std::to_string(rank);
  ::mkdir(dir.c_str(), 0700);
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
}

// A plain TCP connection that sends nothing (a port scan, a health check).
int idle_connection(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the server closes `fd` within `timeout`.
bool closed_within(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

TEST(StoreAuth, ClientsWithoutTheJobSecretAreRefusedAndStoreNothing) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    use_scratch_host_secret(rank);
    ::setenv("RDMAFLOW_JOB_SECRET", kJobSecret, 1);
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(auto server, TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 1));
      RF_ASSERT_OK(ex.allgather(std::to_string(server->address().port)));
      RF_ASSERT_OK(ex.barrier());  // the intruders gave up
      RF_ASSIGN_OR_FAIL(auto store, TcpStore::connect(server->address(), 5000ms, 5000ms));
      for (const char* key : {"no-secret", "wrong-secret"}) {
        auto v = store->get(key, 50ms);
        EXPECT_EQ(v.status().code(), Code::kTimeout) << key << " was stored by an intruder";
      }
      EXPECT_EQ(server->rejected_requests(), 0u) << "an intruder's request was parsed";
      RF_ASSERT_OK(store->set("ok", std::vector<uint8_t>{1}));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    const HostPort at{"127.0.0.1", static_cast<uint16_t>(std::stoi(all[0]))};
    ::unsetenv("RDMAFLOW_JOB_SECRET");  // the per-user host secret: not the job's
    auto none = TcpStore::connect(at, 2000ms, 2000ms);
    RF_ASSERT(!none.is_ok());  // a client without the job secret is not served
    EXPECT_EQ(none.status().code(), Code::kUnauthenticated) << none.status().to_string();
    EXPECT_NE(none.status().reason().find("127.0.0.1:"), std::string::npos)
        << "the refusal does not name the server: " << none.status().to_string();
    ::setenv("RDMAFLOW_JOB_SECRET", "a-wrong-secret-of-another-job", 1);
    auto wrong = TcpStore::connect(at, 2000ms, 2000ms);
    RF_ASSERT(!wrong.is_ok());  // nor one with a wrong secret
    EXPECT_EQ(wrong.status().code(), Code::kUnauthenticated) << wrong.status().to_string();
    RF_ASSERT_OK(ex.barrier());
    ::setenv("RDMAFLOW_JOB_SECRET", kJobSecret, 1);
    RF_ASSIGN_OR_FAIL(auto store, TcpStore::connect(at, 5000ms, 5000ms));
    RF_ASSIGN_OR_FAIL(auto v, store->get("ok", 5000ms));
    EXPECT_EQ(v.size(), 1u);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// An idle stray connection must not make the server wait for it (the bug of
// bench/p2p taking the first connection on its port as its peer), is dropped after
// RDMAFLOW_AUTH_TIMEOUT_MS, and connections beyond the cap are closed at once.
TEST(StoreAuth, StrayConnectionsNeitherBlockNorPile) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    use_scratch_host_secret(rank);
    ::setenv("RDMAFLOW_JOB_SECRET", kJobSecret, 1);
    ::setenv("RDMAFLOW_AUTH_TIMEOUT_MS", "1500", 1);
    ::setenv("RDMAFLOW_AUTH_PENDING_MAX", "2", 1);
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(auto server, TcpStoreServer::start(HostPort{"127.0.0.1", 0}, 1));
      RF_ASSERT_OK(ex.allgather(std::to_string(server->address().port)));
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    const auto port = static_cast<uint16_t>(std::stoi(all[0]));
    const int first = idle_connection(port);
    RF_ASSERT(first >= 0);
    // One stray in the handshake: a real client is served at once all the same.
    // (The stray holds the server for 1500 ms; the client allows itself 1000.)
    RF_ASSIGN_OR_FAIL(auto store, TcpStore::connect(HostPort{"127.0.0.1", port}, 1000ms, 1000ms));
    RF_ASSERT_OK(store->set("k", std::vector<uint8_t>{7}));
    // Two strays fill the cap: a third connection is closed at once.
    const int second = idle_connection(port);
    const int third = idle_connection(port);
    RF_ASSERT(second >= 0 && third >= 0);
    EXPECT_TRUE(closed_within(third, 1000ms)) << "a connection beyond the cap was kept";
    // And the strays are dropped at the handshake timeout.
    EXPECT_TRUE(closed_within(first, 5000ms)) << "an idle stray outlived the handshake timeout";
    EXPECT_TRUE(closed_within(second, 5000ms));
    for (int fd : {first, second, third}) ::close(fd);
    RF_ASSIGN_OR_FAIL(auto v, store->get("k", 1000ms));
    EXPECT_EQ(v.size(), 1u);
    RF_ASSERT_OK(ex.barrier());
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow
