// Per-peer transport selection (runtime/selection/transport_select.h): the pair rule on
// hand-made capability records, then real forked processes on this host, where
// auto must pick UCX (shared memory) for every peer, RDMAFLOW_TRANSPORT=tcp must
// give TCP, RDMAFLOW_TRANSPORT=verbs must fail with the reason (no RDMA here),
// and a job where one rank's UCX has no shared memory (UCX_TLS=tcp) must mix
// UCX and TCP and still run a Session with static and dynamic transfers over
// every pair.
#include "runtime/selection/transport_select.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>

#include "examples/trainer/data_parallel.h"
#include "runtime/session/session.h"
#include "tests/session/session_test_util.h"
#include "tests/support/text.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using dev::free_port;
using testing::boot_rank;
using testing::pattern;
using testing::run_ranks;

using testing::contains;

// ---------------------------------------------------------------- the pair rule

BackendReport backend(const std::string& name, bool viable,
                      std::vector<std::string> components = {}, std::string fabric = {}) {
  BackendReport b;
  b.name = name;
  b.viable = viable;
  if (!viable) b.why_not = "no device";
  b.caps.components = std::move(components);
  b.caps.fabric = std::move(fabric);
  if (!b.caps.fabric.empty()) b.caps.device = "dev0 port 1";
  return b;
}

RankCapabilities host(const std::string& name, std::vector<BackendReport> backends,
                      const std::string& requested = "auto") {
  RankCapabilities r;
  r.requested = requested;
  r.hostname = name;
  r.host_id = "boot-" + name + "/pid:1/ipc:2";
  r.backends = std::move(backends);
  return r;
}

const std::vector<std::string> kShm = {"self", "tcp", "sysv", "posix", "cma"};

PeerTransport decide(int ra, const RankCapabilities& a, int rb, const RankCapabilities& b) {
  auto r = decide_pair(ra, a, rb, b);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : PeerTransport{};
}

// Ranks on one host with an RDMA device each still take shared memory: the
// NIC's loopback (rxe's especially) only adds work to a memcpy.
TEST(DecidePair, SameHostSharedMemoryBeatsVerbs) {
  auto a = host("n1", {backend("verbs", true, {}, "roce 10.0.0.0/24"), backend("ucx", true, kShm),
                       backend("tcp", true)});
  PeerTransport d = decide(0, a, 1, a);
  EXPECT_EQ(d.transport, "ucx");
  EXPECT_EQ(d.reason, "same host 'n1'; UCX shared memory: sysv,posix,cma");
  auto b = host("n2", a.backends);  // the same devices on another host: verbs
  d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "verbs");
  auto no_shm = host("n1", {backend("verbs", true, {}, "roce 10.0.0.0/24"),
                            backend("ucx", true, {"self", "tcp"}), backend("tcp", true)});
  d = decide(0, no_shm, 1, no_shm);  // one host, no UCX shared memory: verbs
  EXPECT_EQ(d.transport, "verbs");
}

TEST(DecidePair, SameHostSharedMemoryPicksUcx) {
  auto a = host("n1", {backend("verbs", false), backend("ucx", true, kShm), backend("tcp", true)});
  PeerTransport d = decide(0, a, 1, a);
  EXPECT_EQ(d.transport, "ucx");
  EXPECT_EQ(d.peer, 1);
  EXPECT_EQ(d.reason, "same host 'n1'; UCX shared memory: sysv,posix,cma");
  EXPECT_EQ(d.describe(),
            "transport to rank 1: ucx (same host 'n1'; UCX shared memory: sysv,posix,cma)");
}

TEST(DecidePair, OneRankWithoutSharedMemoryFallsBackToTcp) {
  auto a = host("n1", {backend("verbs", false), backend("ucx", true, kShm), backend("tcp", true)});
  auto b =
      host("n1", {backend("verbs", false), backend("ucx", true, {"tcp"}), backend("tcp", true)});
  PeerTransport ab = decide(0, a, 3, b);
  PeerTransport ba = decide(3, b, 0, a);
  EXPECT_EQ(ab.transport, "tcp");
  EXPECT_EQ(ab.reason, ba.reason);  // both ends say the same
  EXPECT_EQ(ab.peer, 3);
  EXPECT_EQ(ba.peer, 0);
  EXPECT_TRUE(contains(ab.reason, "verbs not viable on either rank")) << ab.reason;
  EXPECT_TRUE(contains(ab.reason, "no UCX shared memory on rank 3 (UCX transports: tcp)"))
      << ab.reason;
}

TEST(DecidePair, AcrossHostsRdmaPicksVerbsOnOneFabricElseUcx) {
  auto a =
      host("n1", {backend("verbs", true, {}, "ib fe80000000000000"),
                  backend("ucx", true, {"posix", "rc_verbs", "ud_verbs"}), backend("tcp", true)});
  auto b = host("n2", {backend("verbs", true, {}, "ib fe80000000000000"),
                       backend("ucx", true, {"posix", "rc_verbs"}), backend("tcp", true)});
  PeerTransport d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "verbs");
  EXPECT_TRUE(contains(d.reason, "ib fe80000000000000")) << d.reason;

  b.backends[0].caps.fabric = "ib fe80000000000001";  // another subnet
  d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "ucx");
  EXPECT_TRUE(contains(d.reason, "UCX RDMA transports: rc_verbs")) << d.reason;

  b.backends[1].caps.components = {"posix", "tcp"};  // and UCX without RDMA on n2
  d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "tcp");
  EXPECT_TRUE(
      contains(d.reason, "different hosts ('n1', 'n2') and no UCX RDMA transport on rank 1"))
      << d.reason;
}

TEST(DecidePair, RequestedBackendsRestrictThePair) {
  auto a = host("n1", {backend("verbs", false), backend("ucx", true, kShm), backend("tcp", true)});
  auto only_tcp =
      host("n1", {backend("verbs", false), backend("ucx", false), backend("tcp", true)}, "tcp");
  only_tcp.backends[1].why_not = "not requested (RDMAFLOW_TRANSPORT=tcp)";
  PeerTransport d = decide(0, a, 1, only_tcp);
  EXPECT_EQ(d.transport, "tcp");
  EXPECT_TRUE(contains(d.reason, "ucx not allowed on rank 1 (RDMAFLOW_TRANSPORT=tcp)")) << d.reason;
  d = decide(0, only_tcp, 1, only_tcp);
  EXPECT_EQ(d.reason, "RDMAFLOW_TRANSPORT=tcp on both ranks");

  // UCX named on both ranks across hosts without RDMA: what the user asked for.
  auto ua = host(
      "n1", {backend("verbs", false), backend("ucx", true, {"tcp"}), backend("tcp", false)}, "ucx");
  auto ub = host(
      "n2", {backend("verbs", false), backend("ucx", true, {"tcp"}), backend("tcp", false)}, "ucx");
  d = decide(0, ua, 1, ub);
  EXPECT_EQ(d.transport, "ucx");

  // Nothing in common: an error naming both ranks and what they offer.
  auto v =
      host("n1", {backend("verbs", false), backend("ucx", false), backend("tcp", false)}, "verbs");
  auto r = decide_pair(0, a, 1, v);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotViable);
  EXPECT_TRUE(contains(r.status().reason(), "rank 1 (RDMAFLOW_TRANSPORT=verbs) offers nothing"))
      << r.status().to_string();
  EXPECT_TRUE(contains(r.status().reason(), "verbs: no device")) << r.status().to_string();
}

// RoCE devices on one IPv4 subnet take verbs; on two subnets they do not
// (verbs' own fabrics_reach, tests/verbs/address_test.cc, decides).
TEST(DecidePair, RoceSubnetsDecideVerbs) {
  auto a = host("n1", {backend("verbs", true, {}, "roce 10.0.0.0/24"), backend("tcp", true)});
  auto b = host("n2", {backend("verbs", true, {}, "roce 10.0.0.0/24"), backend("tcp", true)});
  PeerTransport d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "verbs");
  EXPECT_TRUE(contains(d.reason, "roce 10.0.0.0/24")) << d.reason;

  b.backends[0].caps.fabric = "roce 10.0.1.0/24";  // another subnet: no RDMA path assumed
  d = decide(0, a, 1, b);
  EXPECT_EQ(d.transport, "tcp");
  EXPECT_TRUE(contains(d.reason, "different fabrics")) << d.reason;

  b.backends[0].caps.fabric = "roce";  // subnet unknown on rank 1
  d = decide(0, a, 1, b);
  PeerTransport e = decide(1, b, 0, a);
  EXPECT_EQ(d.transport, "verbs");
  EXPECT_EQ(d.reason, e.reason);  // both ends log the same reason
  EXPECT_TRUE(contains(d.reason, "roce 10.0.0.0/24")) << d.reason;
}

TEST(CapabilityRecord, RoundTripsAndRefusesGarbage) {
  auto a = host(
      "n1", {backend("verbs", true, {}, "roce"), backend("ucx", true, kShm), backend("tcp", true)});
  Bytes bytes = a.encode();
  auto decoded = RankCapabilities::decode(bytes);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  const RankCapabilities& b = *decoded;
  EXPECT_EQ(b.hostname, "n1");
  EXPECT_EQ(b.host_id, a.host_id);
  ASSERT_EQ(b.backends.size(), 3u);
  EXPECT_EQ(b.backends[0].caps.fabric, "roce");
  EXPECT_EQ(b.backends[1].caps.components, kShm);
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    EXPECT_FALSE(RankCapabilities::decode(std::span<const uint8_t>(bytes.data(), cut)).is_ok());
  }
}

// ---------------------------------------------------------------- real processes

struct ChildEnv {
  std::string name;
  std::string value;
};

// The running rank's Exchange (a forked process has one), e.g. to skip.
testing::Exchange* rank_exchange = nullptr;

// Boots `world` ranks and selects transports; `env(rank)` is set in each child first.
template <typename Body>
testing::RunResult run_selection(int world, std::function<std::vector<ChildEnv>(int)> env,
                                 Body body) {
  const int port = free_port();
  return run_ranks(world, [&](int rank, int w, testing::Exchange& ex) -> int {
    rank_exchange = &ex;
    for (const auto& e : env(rank)) ::setenv(e.name.c_str(), e.value.c_str(), 1);
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, w, port));
    return body(rank, w, *boot);
  });
}

TEST(SelectTransports, AutoOnOneHostPicksUcxForEveryPeer) {
  for (int world : {2, 4}) {
    auto r = run_selection(
        world,
        [](int) {
          return std::vector<ChildEnv>{{"RDMAFLOW_TRANSPORT", "auto"}};
        },
        [](int rank, int w, Bootstrap& boot) -> int {
          auto m = connect_selected_mesh(boot, requested_transport(), 10000ms);
          RF_ASSERT_OK(m.status());
          RF_ASSERT(m->selection->name() == "ucx");
          for (int p = 0; p < w; ++p) {
            const PeerTransport& pt = m->selection->peers()[static_cast<size_t>(p)];
            if (p == rank) {
              RF_ASSERT(pt.transport.empty());
              continue;
            }
            EXPECT_EQ(pt.transport, "ucx") << pt.describe();
            EXPECT_EQ(pt.medium, Medium::kSharedMemory) << pt.describe();
            EXPECT_TRUE(contains(pt.reason, "same host '")) << pt.describe();
            EXPECT_TRUE(contains(pt.reason, "UCX shared memory: ")) << pt.describe();
            EXPECT_TRUE(
                contains(pt.describe(), "transport to rank " + std::to_string(p) + ": ucx ("));
            RF_ASSERT(m->channels[static_cast<size_t>(p)] != nullptr);
            RF_ASSERT(m->channels[static_cast<size_t>(p)]->backend() == "ucx");
          }
          RF_ASSERT_OK(boot.barrier());
          return ::testing::Test::HasFailure() ? 1 : 0;
        });
    RF_EXPECT_RUN_OK(r);
  }
}

TEST(SelectTransports, RequestedTcpGivesTcp) {
  auto r = run_selection(
      3,
      [](int) {
        return std::vector<ChildEnv>{{"RDMAFLOW_TRANSPORT", "tcp"}};
      },
      [](int rank, int w, Bootstrap& boot) -> int {
        RF_ASSIGN_OR_FAIL(SelectedMesh m,
                          connect_selected_mesh(boot, requested_transport(), 10000ms));
        RF_ASSERT(m.selection->name() == "tcp");
        for (int p = 0; p < w; ++p) {
          if (p == rank) continue;
          const PeerTransport& pt = m.selection->peers()[static_cast<size_t>(p)];
          EXPECT_EQ(pt.transport, "tcp");
          EXPECT_EQ(pt.medium, Medium::kSocket);
          EXPECT_EQ(pt.reason, "RDMAFLOW_TRANSPORT=tcp on both ranks");
          RF_ASSERT(m.channels[static_cast<size_t>(p)]->backend() == "tcp");
        }
        RF_ASSERT_OK(boot.barrier());
        return ::testing::Test::HasFailure() ? 1 : 0;
      });
  RF_EXPECT_RUN_OK(r);
}

// RDMAFLOW_IB_DEVICE names no device, so verbs is not viable on any machine,
// with or without RDMA: the request fails on every rank with the reason.
TEST(SelectTransports, RequestedVerbsFailsWithTheReasonWhereItIsNotViable) {
  auto r = run_selection(
      2,
      [](int) {
        return std::vector<ChildEnv>{{"RDMAFLOW_TRANSPORT", "verbs"},
                                     {"RDMAFLOW_IB_DEVICE", "rf_no_such_dev"}};
      },
      [](int, int, Bootstrap& boot) -> int {
        auto m = connect_selected_mesh(boot, requested_transport(), 10000ms);
        RF_ASSERT(!m.is_ok());
        const Status& st = m.status();
        EXPECT_EQ(st.code(), Code::kNotViable) << st.to_string();
        EXPECT_TRUE(contains(st.reason(),
                             "RDMAFLOW_TRANSPORT=verbs, but verbs is not viable on "
                             "this machine: "))
            << st.to_string();
        return ::testing::Test::HasFailure() ? 1 : 0;
      });
  RF_EXPECT_RUN_OK(r);
}

// Where a device exists, asking for verbs gives verbs channels to every peer.
TEST(SelectTransports, RequestedVerbsConnectsEveryPeerWhereItIsViable) {
  auto r = run_selection(
      3,
      [](int) {
        return std::vector<ChildEnv>{{"RDMAFLOW_TRANSPORT", "verbs"}};
      },
      [](int rank, int w, Bootstrap& boot) -> int {
        auto m = connect_selected_mesh(boot, requested_transport(), 20000ms);
        if (!m.is_ok() && m.status().code() == Code::kNotViable) {
          rank_exchange->skip(m.status().to_string());
        }
        RF_ASSERT_OK(m.status());
        RF_ASSERT(m->selection->name() == "verbs");
        for (int p = 0; p < w; ++p) {
          if (p == rank) continue;
          RF_ASSERT(m->channels[static_cast<size_t>(p)]->backend() == "verbs");
        }
        RF_ASSERT_OK(boot.barrier());
        return 0;
      });
  RF_EXPECT_RUN_OK(r);
}

// An unknown name fails on that rank; the others learn why instead of waiting.
TEST(SelectTransports, OneRankAskingForTheImpossibleFailsEveryRank) {
  auto r = run_selection(
      3,
      [](int rank) {
        return std::vector<ChildEnv>{{"RDMAFLOW_TRANSPORT", rank == 1 ? "carrier-pigeon" : "auto"}};
      },
      [](int rank, int, Bootstrap& boot) -> int {
        auto m = connect_selected_mesh(boot, requested_transport(), 10000ms);
        RF_ASSERT(!m.is_ok());
        if (rank == 1) {
          EXPECT_TRUE(contains(m.status().reason(),
                               "RDMAFLOW_TRANSPORT=carrier-pigeon names no "
                               "transport"))
              << m.status().to_string();
        } else {
          EXPECT_TRUE(contains(m.status().reason(),
                               "rank 1 (RDMAFLOW_TRANSPORT=carrier-pigeon) offers nothing"))
              << m.status().to_string();
        }
        return ::testing::Test::HasFailure() ? 1 : 0;
      });
  RF_EXPECT_RUN_OK(r);
}

// ---------------------------------------------------------------- a mixed job

// Three ranks. Rank 0 sends "x" (static) to ranks 1 and 2 and "d" (dynamic,
// often larger than planned, so read from rank 0 through each reader's own
// transport) to both; rank 2 sends "y" to ranks 0 and 1.
graph::GraphFile mixed_graph(int64_t n) {
  graph::GraphFile f;
  f.graph.name = "mixed";
  auto op = [&](const std::string& name, std::vector<std::string> in, std::string out, int rank) {
    (void)f.graph.add_op(name, "Op", std::move(in), {std::move(out)});
    f.placement.rank.push_back(rank);
    f.placement.device.push_back("cpu:0");
  };
  (void)f.graph.add_tensor("x", DataType::kF32, {n});
  (void)f.graph.add_tensor("y", DataType::kF32, {n});
  (void)f.graph.add_tensor("d", DataType::kF32, {graph::kUnknownDim, 16}, 8 * 16 * 4);
  for (const char* t : {"x1", "x2", "y0", "y1", "d1", "d2"}) {
    (void)f.graph.add_tensor(t, DataType::kF32, {});
  }
  op("make_x", {}, "x", 0);
  op("make_d", {}, "d", 0);
  op("make_y", {}, "y", 2);
  op("use_x1", {"x"}, "x1", 1);
  op("use_x2", {"x"}, "x2", 2);
  op("use_y0", {"y"}, "y0", 0);
  op("use_y1", {"y"}, "y1", 1);
  op("use_d1", {"d"}, "d1", 1);
  op("use_d2", {"d"}, "d2", 2);
  return f;
}

void fill(void* p, size_t n, uint64_t step, int salt) {
  auto* f = static_cast<float*>(p);
  for (size_t i = 0; i < n; ++i) f[i] = pattern(step, i, salt);
}

bool check(const void* p, size_t n, uint64_t step, int salt) {
  const auto* f = static_cast<const float*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (f[i] != pattern(step, i, salt)) return false;
  }
  return true;
}

TEST(SelectTransports, MixedJobUsesUcxAndTcpPerPeer) {
  const int port = free_port();
  auto r = run_ranks(3, [&](int rank, int world, testing::Exchange&) -> int {
    // Rank 2's UCX has no shared memory: its pairs fall back to TCP.
    ::setenv("RDMAFLOW_TRANSPORT", "auto", 1);
    if (rank == 2) ::setenv("UCX_TLS", "tcp", 1);
    constexpr int64_t n = 1000;
    constexpr int kSteps = 8;
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, testing::plan_of(mixed_graph(n), world));
    SessionOptions so;
    so.timeout = 10000ms;
    RF_ASSIGN_OR_FAIL(auto s, Session::create(plan, *boot, so));

    const auto& peers = s->peer_transports();
    RF_ASSERT(peers.size() == 3);
    auto expect = [&](int p, const std::string& transport, const std::string& why) {
      EXPECT_EQ(peers[static_cast<size_t>(p)].transport, transport)
          << peers[static_cast<size_t>(p)].describe();
      EXPECT_TRUE(contains(peers[static_cast<size_t>(p)].reason, why))
          << peers[static_cast<size_t>(p)].describe();
    };
    if (rank == 0) {
      expect(1, "ucx", "UCX shared memory");
      expect(2, "tcp", "no UCX shared memory on rank 2 (UCX transports: tcp)");
      EXPECT_EQ(s->transport_name(), "ucx+tcp");
    } else if (rank == 1) {
      expect(0, "ucx", "UCX shared memory");
      expect(2, "tcp", "no UCX shared memory on rank 2");
      EXPECT_EQ(s->transport_name(), "ucx+tcp");
    } else {
      expect(0, "tcp", "no UCX shared memory on rank 2");
      expect(1, "tcp", "no UCX shared memory on rank 2");
      EXPECT_EQ(s->transport_name(), "tcp");
    }

    uint64_t reads = 0;
    for (uint64_t step = 0; step < kSteps; ++step) {
      RF_ASSERT_OK(s->begin_step(step));
      const int64_t rows = step % 2 == 0 ? 300 + static_cast<int64_t>(step) : 3;  // 300: a read
      const size_t elems = static_cast<size_t>(rows * 16);
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto xb, s->output_buffer("x", step, n * 4));
        fill(xb->data, n, step, 1);
        RF_ASSERT_OK(s->send("x", 1, step));
        RF_ASSERT_OK(s->send("x", 2, step));
        RF_ASSIGN_OR_FAIL(auto db, s->output_buffer("d", step, elems * 4));
        fill(db->data, elems, step, 3);
        SendSource src;
        src.dims = {rows, 16};
        RF_ASSERT_OK(s->send("d", 1, step, src));
        RF_ASSERT_OK(s->send("d", 2, step, src));
        RF_ASSIGN_OR_FAIL(RecvView y, s->recv("y", 2, step));
        RF_ASSERT(check(y.data, n, step, 2));
      } else {
        if (rank == 2) {
          RF_ASSIGN_OR_FAIL(auto yb, s->output_buffer("y", step, n * 4));
          fill(yb->data, n, step, 2);
          RF_ASSERT_OK(s->send("y", 0, step));
          RF_ASSERT_OK(s->send("y", 1, step));
        } else {
          RF_ASSIGN_OR_FAIL(RecvView y, s->recv("y", 2, step));
          RF_ASSERT(check(y.data, n, step, 2));
        }
        RF_ASSIGN_OR_FAIL(RecvView x, s->recv("x", 0, step));
        RF_ASSERT(check(x.data, n, step, 1));
        RF_ASSIGN_OR_FAIL(RecvView d, s->recv("d", 0, step));
        RF_ASSERT(d.dims == (std::vector<int64_t>{rows, 16}));
        RF_ASSERT(check(d.data, elems, step, 3));
      }
      RF_ASSERT_OK(s->end_step(step));
    }
    RF_ASSERT_OK(s->finish());
    reads = s->stats().reads;
    if (rank != 0) {
      EXPECT_EQ(reads, kSteps / 2u);  // the large "d" of even steps, read each time
    }
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Data parallelism over the same mixed mesh: the communicator registers its
// slots with both transports and averages across ucx and tcp pairs.
TEST(SelectTransports, MixedJobDataParallelAllreduce) {
  const int port = free_port();
  auto r = run_ranks(3, [&](int rank, int world, testing::Exchange&) -> int {
    ::setenv("RDMAFLOW_TRANSPORT", "auto", 1);
    if (rank == 2) ::setenv("UCX_TLS", "tcp", 1);
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    SessionOptions so;
    so.timeout = 10000ms;
    RF_ASSIGN_OR_FAIL(auto dp, exec::connect_data_parallel(*boot, so));
    EXPECT_EQ(dp->transport_name(), rank == 2 ? "tcp" : "ucx+tcp");
    auto hook = dp->allreduce_hook();
    graph::Op op;
    op.name = "grad";
    std::vector<float> v(100000);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(rank * 3 + static_cast<int>(i % 7));
    exec::TensorView t;
    t.dims = {static_cast<int64_t>(v.size())};
    t.data = v.data();
    t.bytes = v.size() * 4;
    RF_ASSERT_OK(hook(op, 0, t));
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = static_cast<float>(3 + static_cast<int>(i % 7));  // mean of 0, 3, 6 is 3
      if (v[i] != want) {
        ADD_FAILURE() << "rank " << rank << " element " << i << ": " << v[i] << " != " << want;
        return 1;
      }
    }
    RF_ASSERT_OK(boot->barrier());
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow
