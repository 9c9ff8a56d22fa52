// Pulled pieces on the direct path (collectives/fabric.h, "Pulled pieces"):
// a same-host receiver reads a copy-only or reduced piece straight from the
// sender's memory (process_vm_readv) instead of the sender putting it into a
// slot first. Real ranks (forked processes) over UCX shared memory, and over
// UCX within a simulated host plus tcp between hosts, checked against the
// reference; the counters prove which path ran, so each test fails when the
// pull is not taken (or, with RDMAFLOW_COLL_PULL_BYTES=0, when it is).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

// Every flat algorithm of every collective, every type but bool (the
// reference's expected values do not wrap it as the u8 it is stored in),
// sums, a count below the pull threshold and two above, in place and not:
// all agree with the reference.
std::vector<CallSpec> every_call() {
  std::vector<CallSpec> calls;
  uint32_t seed = 1;
  for (CollectiveKind kind : kAllCollectives) {
    for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kDoubleBinaryTree,
                        Algorithm::kRabenseifner, Algorithm::kRecursiveDoubling,
                        Algorithm::kPairwise, Algorithm::kDissemination, Algorithm::kDirect}) {
      if (!algorithm_supports(a, kind)) continue;
      for (DataType t : kAllDataTypes) {
        if (!reducible_dtype(t)) continue;
        for (size_t count : {size_t{3}, size_t{5000}, size_t{70001}}) {
          CallSpec c{kind, a, t, ReduceOp::kSum, count};
          c.seed = seed++;
          c.in_place = seed % 3 == 0 && kind != CollectiveKind::kAlltoall;
          c.root = static_cast<int>(seed % 3);
          calls.push_back(c);
        }
      }
    }
  }
  // Every reduction on one type (the chunked read-and-reduce).
  for (ReduceOp op : kAllReduceOps) {
    calls.push_back({CollectiveKind::kAllreduce, Algorithm::kRing, DataType::kF32, op, 100003});
  }
  return calls;
}

int check_calls(Communicator& comm, const std::vector<CallSpec>& calls, int rank) {
  for (const CallSpec& c : calls) {
    std::string first;
    auto wrong = run_and_check(comm, c, &first);
    if (!wrong.is_ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << describe(c, comm.world_size()) << ": "
                    << wrong.status().to_string();
      return 1;
    }
    if (*wrong != 0) {
      ADD_FAILURE() << "rank " << rank << ": " << describe(c, comm.world_size()) << ": " << *wrong
                    << " wrong, first " << first;
      return 1;
    }
  }
  return 0;
}

// 3 same-host ranks over UCX shared memory with pieces of 4 KiB and more
// pulled: every collective and type right, and pieces really were pulled.
TEST(DirectCopy, EveryCollectiveAndTypePulled) {
  const BackendRow shm = backend_row("ucx_shm");
  RunOptions ro;
  ro.timeout = Millis(300000);
  auto r = run_ranks(
      3,
      [&](int rank, int n, Exchange& ex) {
        setenv("RDMAFLOW_COLL_PULL_BYTES", "4096", 1);
        CommNode node;
        RF_ASSERT_OK(make_comm_node(shm, rank, n, ex, node));
        const FabricStats before = node.comm->stats();
        EXPECT_EQ(before.direct_peers, 2);
        EXPECT_EQ(before.pull_peers, 2) << "the pull probe failed: see the log";
        if (check_calls(*node.comm, every_call(), rank) != 0) return 1;
        const FabricStats st = node.comm->stats();
        EXPECT_GT(st.pull_offers, 0u);
        EXPECT_GT(st.pulled_pieces, 0u);
        // Small pieces still go through the slots.
        EXPECT_GT(st.direct_pieces, st.pull_offers);
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// The default threshold (64 KiB): a large allgather and allreduce pull their
// pieces without any knob.
TEST(DirectCopy, DefaultThresholdPullsLargePieces) {
  const BackendRow shm = backend_row("ucx_shm");
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    unsetenv("RDMAFLOW_COLL_PULL_BYTES");
    CommNode node;
    RF_ASSERT_OK(make_comm_node(shm, rank, n, ex, node));
    EXPECT_EQ(node.comm->stats().pull_peers, 1);
    const std::vector<CallSpec> calls = {
        {CollectiveKind::kAllgather, Algorithm::kRing, DataType::kF32, ReduceOp::kSum, 1 << 20},
        {CollectiveKind::kAllreduce, Algorithm::kRing, DataType::kF32, ReduceOp::kSum, 1 << 20},
        {CollectiveKind::kAllreduce, Algorithm::kRing, DataType::kF32, ReduceOp::kSum, 8}};
    if (check_calls(*node.comm, calls, rank) != 0) return 1;
    const FabricStats st = node.comm->stats();
    EXPECT_GT(st.pulled_pieces, 0u);
    EXPECT_GT(st.pull_offers, 0u);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// The fallback: with RDMAFLOW_COLL_PULL_BYTES=0 on one rank the pair agrees
// not to pull (both sides), every piece goes through the slots, and the
// results are the same. A value that is not a count fails creation.
TEST(DirectCopy, FallbackWhenOneSideDoesNotPull) {
  const BackendRow shm = backend_row("ucx_shm");
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    if (rank == 1) setenv("RDMAFLOW_COLL_PULL_BYTES", "0", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(shm, rank, n, ex, node));
    const FabricStats before = node.comm->stats();
    EXPECT_EQ(before.direct_peers, 1);
    EXPECT_EQ(before.pull_peers, 0);
    std::vector<CallSpec> calls;
    for (CollectiveKind kind : test::kHierKinds) {
      if (kind == CollectiveKind::kBarrier) continue;
      calls.push_back({kind, Algorithm::kRing, DataType::kF32, ReduceOp::kSum, 300001});
    }
    if (check_calls(*node.comm, calls, rank) != 0) return 1;
    const FabricStats st = node.comm->stats();
    EXPECT_GT(st.direct_pieces, 0u);
    EXPECT_EQ(st.pull_offers, 0u);
    EXPECT_EQ(st.pulled_pieces, 0u);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;

  // Both ranks refuse the value in the same place of creation, on a mesh
  // that is up (a rank that fails earlier would close it under the other).
  auto bad = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(shm, rank, n, ex, node));
    node.comm.reset();
    RF_ASSERT_OK(ex.barrier());
    setenv("RDMAFLOW_COLL_PULL_BYTES", "lots", 1);
    Status st = renew_comm(node, rank, n);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("RDMAFLOW_COLL_PULL_BYTES"), std::string::npos) << st.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (bad.skipped) GTEST_SKIP() << bad.message;
  ASSERT_TRUE(bad.ok) << bad.message;
}

// 2 simulated hosts x 2 ranks as the cluster has them (UCX shared memory
// within a host, tcp between): hier's every collective and the tree, with
// the phases within the host pulled.
TEST(DirectCopy, HierOnTwoHostsPullsWithinTheHost) {
  RunOptions ro;
  ro.timeout = Millis(300000);
  auto r = run_ranks(
      4,
      [&](int rank, int n, Exchange& ex) {
        setenv("RDMAFLOW_COLL_PULL_BYTES", "4096", 1);
        CommunicatorOptions co;
        co.slot_bytes = 65536;
        co.timeout = Millis(20000);
        TwoHostNode node;
        RF_ASSERT_OK(make_two_host_node(rank, n, ex, node, co));
        Communicator& comm = *node.comm;
        EXPECT_EQ(comm.stats().pull_peers, 1);
        std::vector<CallSpec> calls;
        uint32_t seed = 1;
        for (CollectiveKind kind : test::kHierKinds) {
          for (Algorithm a : {Algorithm::kHier, Algorithm::kTree}) {
            if (!algorithm_supports(a, kind)) continue;
            for (size_t count : {size_t{7}, size_t{100001}}) {
              CallSpec c{kind, a, DataType::kF32, ReduceOp::kSum, count};
              c.seed = seed++;
              c.root = static_cast<int>(seed % 4);
              calls.push_back(c);
            }
          }
        }
        const int bad = check_calls(comm, calls, rank);
        const FabricStats st = comm.stats();
        EXPECT_GT(st.pulled_pieces, 0u);
        EXPECT_GT(st.pull_offers, 0u);
        RF_ASSERT_OK(ex.barrier());
        return bad;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

}  // namespace
}  // namespace rdmaflow::testing
