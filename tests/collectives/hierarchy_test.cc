// Host groups and the hierarchical collectives in real processes over real
// channels. Every rank here runs on this one machine, so the host groups are
// one host unless a test gives the ranks host keys of their own
// (CommunicatorOptions::host_key): that simulates hosts for the algorithms,
// while each pair's bytes still take the path its channel has.
// tests/cluster runs the same across the hosts of scripts/cluster.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

class Hierarchy : public ::testing::TestWithParam<BackendRow> {
 protected:
  const BackendRow& backend() const { return GetParam(); }
};

// The host groups come from an allgather of host keys over the channels, so
// they are the same with the same-host direct path off; ranks given keys
// rank % 2 form two hosts whose ranks interleave.
TEST_P(Hierarchy, HostGroupsFromHostKeys) {
  for (int mode : {0, 1, 2}) {  // 0: as they are, 1: RDMAFLOW_COLL_DIRECT=0, 2: keys rank % 2
    auto r = run_ranks(4, [&](int rank, int n, Exchange& ex) {
      if (mode == 1) setenv("RDMAFLOW_COLL_DIRECT", "0", 1);
      CommunicatorOptions co;
      if (mode == 2) co.host_key = static_cast<uint64_t>(rank % 2);
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, co));
      const HostGroups& g = node.comm->host_groups();
      EXPECT_EQ(g.world(), n);
      if (mode < 2) {
        EXPECT_EQ(g.hosts(), 1) << g.describe();
        EXPECT_EQ(g.per_host(), n);
        EXPECT_FALSE(g.hierarchical());
        EXPECT_EQ(g.local_rank(rank), rank);
        EXPECT_EQ(g.describe(), "1 host x 4 ranks");
      } else {
        EXPECT_EQ(g.describe(), "2 hosts x 2 ranks");
        EXPECT_TRUE(g.hierarchical());
        EXPECT_EQ(g.host_of(rank), rank % 2);
        EXPECT_EQ(g.local_rank(rank), rank / 2);
        EXPECT_EQ(std::vector<int>(g.ranks(1).begin(), g.ranks(1).end()), (std::vector<int>{1, 3}));
        EXPECT_EQ(g.lane(1), (std::vector<int>{2, 3}));
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << "mode " << mode << ": " << r.message;
  }
}

// The layouts the hier tests run: world ranks, `hosts` simulated hosts (keys
// rank / (world / hosts), or rank % hosts when interleaved; 0: this machine's
// own key, one host, where hier runs its flat schedule).
struct Layout {
  int world;
  int hosts;
  bool interleaved;
};
// 2 x 2, 3 x 2 interleaved, one host, then 2 x 3 (three local ranks: an
// uneven split of the lanes' blocks, recursive-doubling lanes) and 3 x 1
// (one rank per host: the lanes' algorithm over every rank).
constexpr Layout kLayouts[] = {
    {4, 2, false}, {6, 3, true}, {3, 0, false}, {6, 2, false}, {3, 3, false}};

CommunicatorOptions layout_options(const Layout& l, int rank) {
  CommunicatorOptions co;
  co.slot_bytes = 16384;  // many pieces per block
  if (l.hosts > 0) {
    co.host_key =
        static_cast<uint64_t>(l.interleaved ? rank % l.hosts : rank / (l.world / l.hosts));
  }
  return co;
}

const DataType kTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                           DataType::kI32, DataType::kI64, DataType::kU8};

// Runs `calls` in turn on every rank of layout `l` and checks each result;
// with `allreduce_env`, hier is forced by RDMAFLOW_ALLREDUCE_ALGO (the calls
// then ask for auto) rather than per call.
RunResult run_calls(const BackendRow& backend, const Layout& l, const std::vector<CallSpec>& calls,
                    bool allreduce_env) {
  RunOptions ro;
  ro.timeout = Millis(300000);
  return run_ranks(
      l.world,
      [&](int rank, int n, Exchange& ex) {
        if (allreduce_env) setenv("RDMAFLOW_ALLREDUCE_ALGO", "hier", 1);
        CommNode node;
        RF_ASSERT_OK(make_comm_node(backend, rank, n, ex, node, layout_options(l, rank)));
        EXPECT_EQ(node.comm->host_groups().hierarchical(), l.hosts > 0 && l.world > l.hosts);
        // Two hosts: the lanes exchange their blocks by recursive doubling
        // (CostModel::between_hosts), whatever this machine measured.
        const CostModel& model = node.comm->cost_model();
        if (model.two_level() && model.hosts() == 2) {
          EXPECT_EQ(model.between_hosts(4096), Algorithm::kRecursiveDoubling);
        }
        if (allreduce_env) {
          auto chosen = node.comm->select(CollectiveKind::kAllreduce, 1000, DataType::kF32);
          RF_ASSERT_OK(chosen);
          EXPECT_EQ(*chosen, Algorithm::kHier);
        }
        for (const CallSpec& c : calls) {
          std::string first;
          auto wrong = run_and_check(*node.comm, c, &first);
          RF_ASSERT_OK(wrong);
          EXPECT_EQ(*wrong, 0u) << "rank " << rank << " " << node.comm->host_groups().describe()
                                << ": " << describe(c, n) << ": " << first;
          if (*wrong) return 1;
        }
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      ro);
}

// hier, forced by RDMAFLOW_ALLREDUCE_ALGO, over 2 simulated hosts x 2 ranks
// (hosts numbered host by host), 3 x 2 (interleaved) and this one host (where
// it runs the ring within the host): every type and reduction, counts that
// do not divide by the ranks per host or the hosts, in and out of place, and
// a buffer of many pieces.
TEST_P(Hierarchy, HierAllreduceEveryTypeAndReduction) {
  std::vector<CallSpec> calls;
  uint32_t seed = 1;
  for (DataType t : kTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{1001}, size_t{100003}}) {
        CallSpec c{CollectiveKind::kAllreduce, Algorithm::kAuto, t, op, count};
        c.in_place = seed % 2 == 0;
        c.seed = seed++;
        calls.push_back(c);
      }
    }
  }
  for (const Layout& l : kLayouts) {
    const RunResult r = run_calls(backend(), l, calls, true);
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << l.world << " ranks, " << l.hosts << " hosts: " << r.message;
  }
}

// hier's reduce_scatter, allgather, broadcast and reduce, forced per call,
// over the layouts above: every type, the reductions in turn, roots in turn
// (root != 0 included), counts that do not divide by the ranks per host or
// the hosts, in and out of place, buffers of many pieces.
TEST_P(Hierarchy, HierEveryOperation) {
  const CollectiveKind kinds[] = {CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
                                  CollectiveKind::kBroadcast, CollectiveKind::kReduce};
  for (const Layout& l : kLayouts) {
    std::vector<CallSpec> calls;
    uint32_t seed = 1;
    for (CollectiveKind kind : kinds) {
      const bool reduces =
          kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kReduce;
      for (DataType t : kTypes) {
        for (size_t count : {size_t{1}, size_t{5}, size_t{1001}, size_t{30011}}) {
          const ReduceOp op = reduces ? kAllReduceOps[seed % 5] : ReduceOp::kSum;
          CallSpec c{kind, Algorithm::kHier, t, op, count};
          c.root = static_cast<int>((seed * 5 + 1) % static_cast<uint32_t>(l.world));
          c.in_place = seed % 2 == 0;
          c.seed = seed++;
          calls.push_back(c);
        }
      }
    }
    const RunResult r = run_calls(backend(), l, calls, false);
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << l.world << " ranks, " << l.hosts << " hosts: " << r.message;
  }
}

// A barrier holds every rank until all have entered: each rank counts itself
// in a counter the forked ranks share (anonymous shared memory) before
// barrier i, one rank arriving late, and finds all world * (i + 1) entries
// when it leaves. hier, and the flat barriers it falls back to or competes
// with (dissemination once let ranks out early with three rounds).
TEST_P(Hierarchy, BarrierWaitsForEveryRank) {
  for (const auto& [l, algo] : {std::pair{kLayouts[0], Algorithm::kHier},
                                {kLayouts[1], Algorithm::kHier},
                                {kLayouts[2], Algorithm::kHier},
                                {kLayouts[1], Algorithm::kDissemination},
                                {kLayouts[1], Algorithm::kTree}}) {
    void* shared = mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(shared, MAP_FAILED);
    auto* entered = new (shared) std::atomic<int>(0);
    auto r = run_ranks(l.world, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, layout_options(l, rank)));
      constexpr int kRounds = 12;
      for (int i = 0; i < kRounds; ++i) {
        if (rank == i % n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        entered->fetch_add(1);
        CallOptions o;
        o.algorithm = algo;
        RF_ASSERT_OK(node.comm->barrier(o));
        const int seen = entered->load();
        EXPECT_GE(seen, n * (i + 1)) << "rank " << rank << " left barrier " << i << " early";
        if (seen < n * (i + 1)) return 1;
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    munmap(shared, sizeof(std::atomic<int>));
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << algorithm_name(algo) << ", " << l.world << " ranks, " << l.hosts
                      << " hosts: " << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Hierarchy, ::testing::ValuesIn(backend_rows()),
                         [](const auto& info) { return info.param.label; });

// 2 simulated hosts x 2 ranks as the cluster has them: same-host peers over
// UCX shared memory (the direct path), the others over tcp, every rank
// yielding while it waits as crowded ranks do (RDMAFLOW_COLL_YIELD=1). Each
// of the three waits for both kinds of peer: one ppoll (Fabric::mixed_driver,
// the wake socket of common/doorbell.h) with RDMAFLOW_COLL_MIXED_WAIT=1; the
// tcp sockets polled by the waiter beside the direct words, handed back to
// tcp's progress thread before a doorbell sleep (Fabric::mixed_poll_driver,
// the default); and with RDMAFLOW_COLL_MIXED_POLL=0 the words polled while
// the progress thread reads the sockets. Many back-to-back calls of every
// size class (8 B to many pieces, hier, tree and ring, barriers among them):
// any wrong reply or error fails the run. (The lost-wake-up stress, where no
// recheck can hide one, is MemoryChannel.FdSleeperIsWokenByEverySignal.)
TEST(MixedPeers, EveryWaitOverSocketsAndSameHostPeers) {
  RunOptions ro;
  ro.timeout = Millis(300000);
  struct Mode {
    const char* wait;  // RDMAFLOW_COLL_MIXED_WAIT
    const char* poll;  // RDMAFLOW_COLL_MIXED_POLL
  };
  for (const Mode mode : {Mode{"1", "1"}, Mode{"0", "1"}, Mode{"0", "0"}}) {
    const bool one_ppoll = *mode.wait == '1';
    const bool polled = !one_ppoll && *mode.poll == '1';
    const std::string label = std::string("RDMAFLOW_COLL_MIXED_WAIT=") + mode.wait +
                              " RDMAFLOW_COLL_MIXED_POLL=" + mode.poll;
    auto r = run_ranks(
        4,
        [&](int rank, int n, Exchange& ex) {
          setenv("RDMAFLOW_COLL_MIXED_WAIT", mode.wait, 1);
          setenv("RDMAFLOW_COLL_MIXED_POLL", mode.poll, 1);
          setenv("RDMAFLOW_COLL_YIELD", "1", 1);
          CommunicatorOptions co;
          co.slot_bytes = 65536;
          co.timeout = Millis(20000);
          TwoHostNode node;
          RF_ASSERT_OK(make_two_host_node(rank, n, ex, node, co));
          auto& comm = node.comm;
          const FabricStats st = comm->stats();
          EXPECT_EQ(st.direct_peers, 1);
          EXPECT_EQ(st.mixed_wait, one_ppoll) << "rank " << rank << " " << label;
          EXPECT_EQ(st.mixed_poll, polled) << "rank " << rank << " " << label;
          std::vector<CallSpec> calls;
          uint32_t seed = 1;
          for (int round = 0; round < 40; ++round) {
            for (Algorithm a : {Algorithm::kHier, Algorithm::kTree, Algorithm::kRing}) {
              for (size_t count : {size_t{2}, size_t{1001}, size_t{70000}}) {
                CallSpec c{CollectiveKind::kAllreduce, a, DataType::kF32, ReduceOp::kSum, count};
                c.seed = seed++;
                calls.push_back(c);
              }
            }
          }
          for (const CallSpec& c : calls) {
            std::string first;
            auto wrong = run_and_check(*comm, c, &first);
            RF_ASSERT_OK(wrong);
            EXPECT_EQ(*wrong, 0u) << "rank " << rank << ": " << describe(c, n) << ": " << first;
            if (*wrong) return 1;
            if (c.seed % 7 == 0) RF_ASSERT_OK(comm->barrier());
          }
          RF_ASSERT_OK(ex.barrier());
          return 0;
        },
        ro);
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << label << ": " << r.message;
  }
}

}  // namespace
}  // namespace rdmaflow::testing
