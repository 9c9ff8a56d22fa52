// Bootstrap: rendezvous of real processes, barrier/allgather through the store,
// the server's lifetime, misconfigurations, and the full channel mesh over TCP.
#include "runtime/rendezvous/bootstrap.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tests/support/process.h"
#include "tests/support/text.h"
#include "tools/free_port.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using dev::free_port;
using testing::Exchange;
using testing::run_ranks;
using Clock = std::chrono::steady_clock;

RankInfo ranks(int rank, int world) {
  RankInfo info;
  info.rank = rank;
  info.world_size = world;
  info.local_rank = rank;
  info.single_host = true;
  info.source = "test";
  return info;
}

BootstrapOptions options_for(int rank, int world, int port, Millis timeout = 10000ms) {
  BootstrapOptions o;
  o.rank_info = ranks(rank, world);
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.timeout = timeout;
  return o;
}

using testing::contains;

std::string text_of(const Bytes& b) {
  return as_string(b);
}

// Sends "r->p" on every channel and expects "p->r" from each.
int exchange_on_every_channel(const ChannelMesh& mesh, int me, const std::string& tag) {
  CompletionGroup sent;
  for (int p = 0; p < static_cast<int>(mesh.size()); ++p) {
    if (p == me) {
      RF_ASSERT(mesh[p] == nullptr);
      continue;
    }
    RF_ASSERT(mesh[p] != nullptr);
    RF_ASSERT(mesh[p]->peer_rank() == p);
    mesh[p]->send_message(to_bytes(tag + std::to_string(me) + "->" + std::to_string(p)), sent.add(),
                          5000ms);
  }
  RF_ASSERT_OK(sent.wait(5000ms));
  for (int p = 0; p < static_cast<int>(mesh.size()); ++p) {
    if (p == me) continue;
    auto msg = mesh[p]->inbox().recv_message(5000ms);
    RF_ASSERT_OK(msg);
    if (text_of(*msg) != tag + std::to_string(p) + "->" + std::to_string(me)) {
      std::fprintf(stderr, "rank %d got '%s' from rank %d\n", me, text_of(*msg).c_str(), p);
      return 1;
    }
  }
  return 0;
}

// A second, real TCP transport under another name, to exercise per-peer choice.
class RenamedTransport : public Transport {
 public:
  RenamedTransport(std::unique_ptr<Transport> inner, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string registrar_name() const override { return name_; }
  Result<RegionId> register_memory(void* addr, size_t len) override {
    return inner_->register_memory(addr, len);
  }
  Status deregister_memory(RegionId region) override { return inner_->deregister_memory(region); }
  Result<std::string> listen() override { return inner_->listen(); }
  Result<std::shared_ptr<Channel>> connect(int peer, const std::string& address,
                                           Millis timeout) override {
    return inner_->connect(peer, address, timeout);
  }
  Result<std::shared_ptr<Channel>> accept(int peer, Millis timeout) override {
    return inner_->accept(peer, timeout);
  }
  Result<RemoteKey> export_key(const void* addr, size_t len) override {
    return inner_->export_key(addr, len);
  }
  Status revoke_key(const RemoteKey& key) override { return inner_->revoke_key(key); }
  void shutdown() override { inner_->shutdown(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::string name_;
};

// ---- one process ----

TEST(Bootstrap, SingleProcessNeedsNoRendezvous) {
  BootstrapOptions o;
  o.rank_info = ranks(0, 1);
  auto boot = Bootstrap::create(o);
  ASSERT_TRUE(boot.is_ok()) << boot.status().to_string();
  Bootstrap& b = **boot;
  EXPECT_EQ(b.rank(), 0);
  EXPECT_EQ(b.world_size(), 1);
  EXPECT_EQ(b.rendezvous(), "");
  EXPECT_TRUE(b.barrier().is_ok());
  auto all = b.allgather(to_bytes("me"));
  ASSERT_TRUE(all.is_ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(text_of((*all)[0]), "me");
  ASSERT_TRUE(b.store().set("k", to_bytes("v")).is_ok());
  EXPECT_EQ(text_of(*b.store().get("k")), "v");
  auto mesh = b.connect_mesh([](int) -> Transport* { return nullptr; });  // no peers to ask for
  ASSERT_TRUE(mesh.is_ok()) << mesh.status().to_string();
  ASSERT_EQ(mesh->size(), 1u);
  EXPECT_EQ((*mesh)[0], nullptr);
  EXPECT_TRUE(b.finalize().is_ok());
}

// ---- several processes ----

TEST(Bootstrap, FourProcessesFromTheEnvironment) {
  const int port = free_port();
  constexpr int kWorld = 4;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    ::setenv("RDMAFLOW_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("RDMAFLOW_WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
    ::setenv("RDMAFLOW_RENDEZVOUS", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    ::setenv("RDMAFLOW_TIMEOUT_MS", "10000", 1);
    auto boot = Bootstrap::create();
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    RF_ASSERT(b.rank() == rank);
    RF_ASSERT(b.world_size() == kWorld);
    RF_ASSERT(contains(b.rank_info().source, "RDMAFLOW_RANK"));
    RF_ASSERT(b.rendezvous() == "127.0.0.1:" + std::to_string(port));
    RF_ASSERT(b.timeout() == 10000ms);

    auto all = b.allgather(to_bytes("rank" + std::to_string(rank)));
    RF_ASSERT_OK(all);
    RF_ASSERT(all->size() == kWorld);
    for (int r = 0; r < kWorld; ++r) RF_ASSERT(text_of((*all)[r]) == "rank" + std::to_string(r));

    // The user namespace of the store is shared by every rank.
    RF_ASSERT_OK(b.store().set("hello/" + std::to_string(rank), to_bytes("x")));
    RF_ASSERT_OK(b.store().wait({"hello/0", "hello/1", "hello/2", "hello/3"}));
    auto n = b.store().add("count", 1);
    RF_ASSERT_OK(n);
    for (int i = 0; i < 3; ++i) RF_ASSERT_OK(b.barrier());
    RF_ASSERT(text_of(*b.store().get("count")) == "4");

    // A second allgather does not see the first one's values.
    auto again = b.allgather(to_bytes(std::string(rank + 1, 'z')));
    RF_ASSERT_OK(again);
    for (int r = 0; r < kWorld; ++r) RF_ASSERT((*again)[r].size() == static_cast<size_t>(r + 1));
    RF_ASSERT_OK(b.finalize());
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, RankZeroServesUntilEveryRankSaidGoodbye) {
  const int port = free_port();
  auto run = run_ranks(2, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, 2, port));
    RF_ASSERT_OK(boot);
    if (rank == 0) {
      RF_ASSERT_OK((*boot)->store().set("written/by/0", to_bytes("still here")));
      const auto t0 = Clock::now();
      boot->reset();  // rank 0 is done, but rank 1 has not read yet
      const auto lingered = Clock::now() - t0;
      RF_ASSERT(lingered >= 150ms);  // it waited for rank 1's goodbye
      RF_ASSERT(lingered < 5000ms);
      return 0;
    }
    std::this_thread::sleep_for(500ms);  // a late reader
    auto v = (*boot)->store().get("written/by/0", 2000ms);
    RF_ASSERT_OK(v);
    RF_ASSERT(text_of(*v) == "still here");
    return 0;  // the destructor says goodbye
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, LaggingRankZeroIsWaitedFor) {
  // Every other rank starts first and keeps retrying until rank 0 serves.
  const int port = free_port();
  auto run = run_ranks(3, [&](int rank, int, Exchange&) -> int {
    if (rank == 0) std::this_thread::sleep_for(300ms);
    auto boot = Bootstrap::create(options_for(rank, 3, port));
    RF_ASSERT_OK(boot);
    RF_ASSERT_OK((*boot)->barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, BarrierTimeoutSaysHowManyArrived) {
  const int port = free_port();
  // World of 3, only 2 processes: joining cannot complete.
  auto run = run_ranks(2, [&](int rank, int, Exchange&) -> int {
    const auto t0 = Clock::now();
    auto boot = Bootstrap::create(options_for(rank, 3, port, 400ms));
    RF_ASSERT(!boot.is_ok());
    const std::string msg = boot.status().to_string();
    // Rank 0 times out first and stops serving: rank 1 may see the server go away.
    const bool counted =
        boot.status().code() == Code::kTimeout && contains(msg, "only 2 of 3 ranks arrived within");
    const bool server_gone =
        rank == 1 && ((boot.status().code() == Code::kPeerFailed &&
                       contains(msg, "lost the connection to the rendezvous")) ||
                      contains(msg, "not all 3 ranks arrived within"));
    if (!counted && !server_gone) {
      std::fprintf(stderr, "unexpected: %s\n", msg.c_str());
      return 1;
    }
    RF_ASSERT(Clock::now() - t0 < 3000ms);
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, DuplicateRankIsRefused) {
  const int port = free_port();
  // Processes claim ranks 0, 1 and 1 of a world of 2.
  auto run = run_ranks(3, [&](int i, int, Exchange&) -> int {
    if (i == 2) std::this_thread::sleep_for(100ms);  // the impostor comes last
    auto boot = Bootstrap::create(options_for(i == 0 ? 0 : 1, 2, port, 3000ms));
    if (i == 2) {
      RF_ASSERT(!boot.is_ok());
      if (!contains(boot.status().to_string(), "already joined")) {
        std::fprintf(stderr, "unexpected: %s\n", boot.status().to_string().c_str());
        return 1;
      }
      return 0;
    }
    RF_ASSERT_OK(boot);
    std::this_thread::sleep_for(300ms);  // keep the server up for the impostor
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, WorldSizeDisagreementIsAnError) {
  const int port = free_port();
  auto run = run_ranks(2, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, rank == 0 ? 2 : 3, port, 500ms));
    RF_ASSERT(!boot.is_ok());
    if (rank == 1 && !contains(boot.status().to_string(), "rank 0 has 2")) {
      std::fprintf(stderr, "unexpected: %s\n", boot.status().to_string().c_str());
      return 1;
    }
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(Bootstrap, RendezvousMustBeKnownForSeveralHosts) {
  ::unsetenv("RDMAFLOW_RENDEZVOUS");
  BootstrapOptions o;
  o.rank_info = ranks(1, 2);
  o.rank_info->single_host.reset();  // e.g. RDMAFLOW_RANK without RDMAFLOW_LOCAL_SIZE
  o.timeout = 200ms;
  auto boot = Bootstrap::create(o);
  ASSERT_FALSE(boot.is_ok());
  EXPECT_TRUE(contains(boot.status().to_string(), "RDMAFLOW_RENDEZVOUS is not set"))
      << boot.status().to_string();

  // On one host the default is used (nobody serves it here: the error names it).
  o.rank_info->single_host = true;
  boot = Bootstrap::create(o);
  ASSERT_FALSE(boot.is_ok());
  EXPECT_TRUE(contains(boot.status().to_string(), kDefaultLocalRendezvous))
      << boot.status().to_string();

  o.rendezvous = "localhost";
  boot = Bootstrap::create(o);
  ASSERT_FALSE(boot.is_ok());
  EXPECT_EQ(boot.status().code(), Code::kInvalidArgument);
  o.rendezvous = "127.0.0.1:0";
  boot = Bootstrap::create(o);
  ASSERT_FALSE(boot.is_ok());
  EXPECT_TRUE(contains(boot.status().to_string(), "port 0")) << boot.status().to_string();
}

// ---- the channel mesh over the TCP transport ----

TEST(BootstrapMesh, FourProcessesFullMeshOverTcp) {
  const int port = free_port();
  constexpr int kWorld = 4;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, kWorld, port));
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    auto tcp = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(tcp);
    const auto t0 = Clock::now();
    auto mesh = b.connect_mesh(**tcp);
    RF_ASSERT_OK(mesh);
    if (rank == 0) {
      std::fprintf(stderr, "4-rank tcp mesh built in %.1f ms\n",
                   std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    RF_ASSERT(mesh->size() == kWorld);
    if (exchange_on_every_channel(*mesh, rank, "m1:") != 0) return 1;

    // One-sided write with notify on every channel, keys exchanged through allgather.
    std::vector<uint8_t> landing(kWorld * 64, 0);
    auto region = (*tcp)->register_memory(landing.data(), landing.size());
    RF_ASSERT_OK(region);
    auto key = (*tcp)->export_key(landing.data(), landing.size());
    RF_ASSERT_OK(key);
    auto keys = b.allgather(key->serialize());
    RF_ASSERT_OK(keys);
    std::vector<uint8_t> src(64, static_cast<uint8_t>(0xA0 + rank));
    CompletionGroup writes;
    for (int p = 0; p < kWorld; ++p) {
      if (p == rank) continue;
      auto peer_key = RemoteKey::deserialize((*keys)[p]);
      RF_ASSERT_OK(peer_key);
      (*mesh)[p]->write(src.data(), src.size(), *peer_key, rank * 64, uint64_t(rank), writes.add(),
                        5000ms);
    }
    RF_ASSERT_OK(writes.wait(5000ms));
    for (int p = 0; p < kWorld; ++p) {
      if (p == rank) continue;
      RF_ASSERT_OK((*mesh)[p]->inbox().wait_notify_value(uint64_t(p), 5000ms));
      RF_ASSERT(landing[p * 64] == 0xA0 + p && landing[p * 64 + 63] == 0xA0 + p);
    }
    RF_ASSERT_OK(b.barrier());  // nobody tears down before everyone is done

    // A second mesh over a second transport, in the same job.
    auto tcp2 = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(tcp2);
    auto mesh2 = b.connect_mesh(**tcp2);
    RF_ASSERT_OK(mesh2);
    if (exchange_on_every_channel(*mesh2, rank, "m2:") != 0) return 1;
    RF_ASSERT_OK(b.barrier());
    (*tcp2)->shutdown();
    (*tcp)->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(BootstrapMesh, TransportChosenPerPeer) {
  const int port = free_port();
  constexpr int kWorld = 4;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, kWorld, port));
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    auto plain = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(plain);
    auto inner = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(inner);
    RenamedTransport alt(std::move(*inner), "tcp-alt");
    // Pairs with an odd rank sum use the alternative; both ends agree.
    auto select = [&](int peer) -> Transport* {
      return (peer + rank) % 2 == 1 ? static_cast<Transport*>(&alt) : plain->get();
    };
    auto mesh = b.connect_mesh(select);
    RF_ASSERT_OK(mesh);
    if (exchange_on_every_channel(*mesh, rank, "pp:") != 0) return 1;
    RF_ASSERT_OK(b.barrier());
    alt.shutdown();
    (*plain)->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(BootstrapMesh, DisagreementFailsFastOnEveryRank) {
  const int port = free_port();
  constexpr int kWorld = 3;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, kWorld, port, 20000ms));
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    auto plain = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(plain);
    auto inner = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(inner);
    RenamedTransport alt(std::move(*inner), "tcp-alt");
    // Rank 2 wants "tcp-alt" towards rank 0; everyone else uses "tcp".
    auto select = [&](int peer) -> Transport* {
      return rank == 2 && peer == 0 ? static_cast<Transport*>(&alt) : plain->get();
    };
    const auto t0 = Clock::now();
    auto mesh = b.connect_mesh(select);
    const auto took = Clock::now() - t0;
    RF_ASSERT(!mesh.is_ok());
    const std::string msg = mesh.status().to_string();
    if (!contains(msg, "tcp-alt")) {
      std::fprintf(stderr, "rank %d: unexpected: %s\n", rank, msg.c_str());
      return 1;
    }
    RF_ASSERT(took < 5000ms);  // nobody waited for the 20 s timeout
    // The job is still usable after the failure.
    RF_ASSERT_OK(b.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

// Rank 2 holds another job secret once the store is joined: its connects are
// refused at the handshake. Rank 0 would otherwise wait for rank 2 in accept
// until the 20 s timeout; the refusal, counted in the store, stops it at once.
TEST(BootstrapMesh, ARefusedConnectFailsEveryRankAtOnce) {
  const int port = free_port();
  constexpr int kWorld = 3;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    ::setenv("RDMAFLOW_JOB_SECRET", "the-job-secret-0123456789abcdef", 1);
    auto boot = Bootstrap::create(options_for(rank, kWorld, port, 20000ms));
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    if (rank == 2) ::setenv("RDMAFLOW_JOB_SECRET", "another-secret-0123456789abcdef", 1);
    auto tcp = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(tcp);
    const auto t0 = Clock::now();
    auto mesh = b.connect_mesh(**tcp);
    const auto took = Clock::now() - t0;
    RF_ASSERT(!mesh.is_ok());
    const std::string msg = mesh.status().to_string();
    if (!contains(msg, rank == 2 ? "job secret" : "rank 2")) {
      std::fprintf(stderr, "rank %d: unexpected: %s\n", rank, msg.c_str());
      return 1;
    }
    RF_ASSERT(took < 10000ms);  // nobody waited for the 20 s timeout
    (*tcp)->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

TEST(BootstrapMesh, ARankWithoutATransportFailsTheMeshEverywhere) {
  const int port = free_port();
  constexpr int kWorld = 3;
  auto run = run_ranks(kWorld, [&](int rank, int, Exchange&) -> int {
    auto boot = Bootstrap::create(options_for(rank, kWorld, port, 20000ms));
    RF_ASSERT_OK(boot);
    Bootstrap& b = **boot;
    auto tcp = make_transport("tcp", b.transport_config());
    RF_ASSERT_OK(tcp);
    auto select = [&](int) -> Transport* { return rank == 1 ? nullptr : tcp->get(); };
    const auto t0 = Clock::now();
    auto mesh = b.connect_mesh(select);
    RF_ASSERT(!mesh.is_ok());
    const std::string msg = mesh.status().to_string();
    if (!contains(msg, "no transport chosen")) {
      std::fprintf(stderr, "rank %d: unexpected: %s\n", rank, msg.c_str());
      return 1;
    }
    RF_ASSERT(Clock::now() - t0 < 5000ms);
    return 0;
  });
  RF_EXPECT_RUN_OK(run);
}

}  // namespace
}  // namespace rdmaflow
