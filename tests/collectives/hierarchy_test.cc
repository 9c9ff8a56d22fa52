// Host groups and the hierarchical collectives in real processes over real
// channels. Every rank here runs on this one machine, so the host groups are
// one host unless a test gives the ranks host keys of their own
// (CommunicatorOptions::host_key): that simulates hosts for the algorithms,
// while each pair's bytes still take the path its channel has.
// tests/cluster runs the same across the hosts of scripts/cluster.
#include <gtest/gtest.h>

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

const DataType kTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                           DataType::kI32, DataType::kI64, DataType::kU8};

// hier, forced by RDMAFLOW_ALLREDUCE_ALGO, over 2 simulated hosts x 2 ranks
// (hosts numbered host by host), 3 x 2 (interleaved) and this one host (where
// it runs the ring within the host): every type and reduction, counts that
// do not divide by the ranks per host or the hosts, in and out of place, and
// a buffer of many pieces.
TEST_P(Hierarchy, HierAllreduceEveryTypeAndReduction) {
  struct Layout {
    int world;
    int hosts;  // keys: rank / (world / hosts); 0: this machine's own key
    bool interleaved;
  };
  for (Layout l : {Layout{4, 2, false}, Layout{6, 3, true}, Layout{3, 0, false}}) {
    RunOptions ro;
    ro.timeout = Millis(300000);
    auto r = run_ranks(
        l.world,
        [&](int rank, int n, Exchange& ex) {
          setenv("RDMAFLOW_ALLREDUCE_ALGO", "hier", 1);
          CommunicatorOptions co;
          co.slot_bytes = 16384;  // many pieces per block
          if (l.hosts > 0) {
            co.host_key =
                static_cast<uint64_t>(l.interleaved ? rank % l.hosts : rank / (n / l.hosts));
          }
          CommNode node;
          RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, co));
          EXPECT_EQ(node.comm->host_groups().hierarchical(), l.hosts > 0);
          auto chosen = node.comm->select(CollectiveKind::kAllreduce, 1000, DataType::kF32);
          RF_ASSERT_OK(chosen);
          EXPECT_EQ(*chosen, Algorithm::kHier);
          uint32_t seed = 1;
          for (DataType t : kTypes) {
            for (ReduceOp op : kAllReduceOps) {
              for (size_t count : {size_t{1}, size_t{5}, size_t{1001}, size_t{100003}}) {
                CallSpec c{CollectiveKind::kAllreduce, Algorithm::kAuto, t, op, count};
                c.in_place = seed % 2 == 0;
                c.seed = seed++;
                std::string first;
                auto wrong = run_and_check(*node.comm, c, &first);
                RF_ASSERT_OK(wrong);
                EXPECT_EQ(*wrong, 0u)
                    << "rank " << rank << " " << node.comm->host_groups().describe() << ": "
                    << describe(c, n) << ": " << first;
                if (*wrong) return 1;
              }
            }
          }
          RF_ASSERT_OK(ex.barrier());
          return 0;
        },
        ro);
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << l.world << " ranks, " << l.hosts << " hosts: " << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Hierarchy, ::testing::ValuesIn(backend_rows()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace rdmaflow::testing
