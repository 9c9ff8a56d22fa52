// Collectives in real processes over real channels (TCP, and UCX when it is
// built and viable): a representative slice of the correctness matrix (the
// whole product runs under the "collectives-full" label, matrix_test.cc),
// asynchronous calls in flight at once, algorithm forcing, and failures that
// name the peer and the collective.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <optional>
#include <thread>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

class Collectives : public ::testing::TestWithParam<BackendRow> {
 protected:
  const BackendRow& backend() const { return GetParam(); }
};

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduceScatter ||
         k == CollectiveKind::kReduce;
}

const DataType kTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                           DataType::kI32, DataType::kI64, DataType::kU8};

// SIGKILLs `victim` through the parent `after` from now, from a thread of its
// own, so that the caller is inside a collective when it dies.
class DelayedKill {
 public:
  DelayedKill(Exchange& ex, int victim, Millis after = Millis(300))
      : thread_([this, &ex, victim, after] {
          std::this_thread::sleep_for(after);
          EXPECT_TRUE(ex.kill(victim).is_ok());
          killed_at_ = std::chrono::steady_clock::now().time_since_epoch().count();
        }) {}
  ~DelayedKill() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits for the kill; how long before `t` it happened.
  std::chrono::steady_clock::duration before(std::chrono::steady_clock::time_point t) {
    thread_.join();
    return t - std::chrono::steady_clock::time_point(
                   std::chrono::steady_clock::duration(killed_at_.load()));
  }

 private:
  std::atomic<int64_t> killed_at_{0};
  std::thread thread_;
};

// Every algorithm at every world size 1..8, with counts 0, 1, < world, odd and
// a few pieces' worth; types and reductions rotate so each appears everywhere.
TEST_P(Collectives, EveryAlgorithmRepresentativeSlice) {
  for (int world : {1, 2, 3, 4, 5, 6, 7, 8}) {
    RunOptions ro;
    ro.timeout = Millis(120000);
    auto r = run_ranks(
        world,
        [&](int rank, int n, Exchange& ex) {
          CommNode node;
          CommunicatorOptions opts;
          opts.slot_bytes = 4096;  // many pieces and slot reuse even for small counts
          opts.slots = 2;
          RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, opts));
          uint32_t seed = 1;
          for (const KindAlgorithm& a : supported_pairs()) {
            const size_t counts[] = {0, 1, static_cast<size_t>(std::max(1, n - 1)), 1001, 5003};
            for (size_t count : counts) {
              CallSpec c;
              c.kind = a.kind;
              c.algo = a.algo;
              c.type = kTypes[seed % 7];
              c.op = reduces(a.kind) ? kAllReduceOps[(seed / 7) % 5] : ReduceOp::kSum;
              c.count = count;
              c.root = static_cast<int>(seed % n);
              c.in_place = seed % 2 == 0 && a.kind != CollectiveKind::kBarrier;
              c.seed = seed++;
              RF_ASSERT_OK(check_call(*node.comm, c));
            }
          }
          // Nobody tears down its channels while a peer may still finish its last call.
          RF_ASSERT_OK(ex.barrier());
          return 0;
        },
        ro);
    ASSERT_TRUE(r.ok || r.skipped) << "world " << world << ": " << r.message;
    if (r.skipped) GTEST_SKIP() << r.message;
  }
}

// 1 MiB + 1 elements through every allreduce algorithm at a non-power-of-two
// world, with the default (large) slots.
TEST_P(Collectives, LargeAllreduceEveryAlgorithm) {
  auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    uint32_t seed = 7;
    for (Algorithm algo : algorithms_for(CollectiveKind::kAllreduce)) {
      CallSpec c{CollectiveKind::kAllreduce, algo, DataType::kF32, ReduceOp::kSum, (1u << 20) + 1};
      c.seed = seed++;
      RF_ASSERT_OK(check_call(*node.comm, c));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Slot credits on the notify path may wait for a frame to ride with
// (collectives/fabric.h, "Credits ride with other frames"). Back-to-back
// broadcasts from one root, whose receivers never send it anything, then
// back-to-back allreduces, with one slot, a few, and as many credits held as
// the fabric allows (RDMAFLOW_COLL_CREDIT_HOLD over slots - 1 means slots -
// 1): every call finishes, right, before a 5 s call timeout. A sender that
// needs a held credit gets it without the receiver doing anything more.
TEST_P(Collectives, HeldCreditsNeverStallTheSender) {
  for (int slots : {1, 2, 4}) {
    for (const char* hold : {"", "99"}) {
      auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
        if (*hold != '\0') setenv("RDMAFLOW_COLL_CREDIT_HOLD", hold, 1);
        CommunicatorOptions options;
        options.slots = slots;
        options.slot_bytes = 4096;
        options.measure = false;
        options.timeout = Millis(5000);
        CommNode node;
        RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, options));
        const size_t big = 3 * 1024 + 5;  // f32: several 4 KiB pieces
        std::vector<float> buf(big), in(big), out(big);
        for (int call = 0; call < 150; ++call) {
          const size_t count = call % 3 == 2 ? big : 2;
          for (size_t i = 0; i < count; ++i) {
            buf[i] = rank == 0 ? static_cast<float>(call + i % 5) : -1.0f;
          }
          RF_ASSERT_OK(node.comm->broadcast(buf.data(), buf.data(), count, DataType::kF32, 0));
          for (size_t i = 0; i < count; ++i) RF_ASSERT(buf[i] == static_cast<float>(call + i % 5));
        }
        for (int call = 0; call < 60; ++call) {
          const size_t count = call % 3 == 2 ? big : 2;
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + call + i % 3);
          RF_ASSERT_OK(
              node.comm->allreduce(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum));
          for (size_t i = 0; i < count; ++i) {
            RF_ASSERT(out[i] == static_cast<float>(3 + 3 * (call + i % 3)));
          }
        }
        RF_ASSERT_OK(ex.barrier());
        return 0;
      });
      if (r.skipped) GTEST_SKIP() << r.message;
      ASSERT_TRUE(r.ok) << "slots " << slots << " hold '" << hold << "': " << r.message;
    }
  }
}

// Communicators that a test makes again and again on one mesh (renew_comm):
// nothing measured at creation, calls bounded at 5 s.
CommunicatorOptions renewable_options() {
  CommunicatorOptions options;
  options.measure = false;
  options.timeout = Millis(5000);
  return options;
}

// Communicators made and destroyed one after another on one mesh, with no
// barrier between: a credit a peer still holds for the last call's pieces
// (tcp defers them, collectives/fabric.h) lands before the keys it writes to
// are revoked, so no channel fails and the next communicator works.
TEST_P(Collectives, CommunicatorsComeAndGoOnOneMesh) {
  auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
    const CommunicatorOptions options = renewable_options();
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, options));
    std::vector<float> in(2), out(2);
    for (int round = 0; round < 40; ++round) {
      if (round > 0) RF_ASSERT_OK(renew_comm(node, rank, n, options));
      in[0] = static_cast<float>(rank + round);
      in[1] = 1.0f;
      RF_ASSERT_OK(node.comm->allreduce(in.data(), out.data(), 2, DataType::kF32, ReduceOp::kSum));
      RF_ASSERT(out[0] == static_cast<float>(3 + 3 * round) && out[1] == 3.0f);
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// The credit that comes after the destroyed communicator's drain gave up
// (Fabric::kCreditDrain): rank 1 is stopped (SIGSTOP) while rank 0 broadcasts
// to and destroys its communicator, which revokes the keys the credit writes
// to, and continued 500 ms later, or once the destruction is over where it
// takes longer (a slow guest): the credit comes after the revoke, not in
// flight with it. It must not fail its channel to rank 0 (the refusal of a
// posted write would): a loaded machine deschedules a peer that long, and the
// next communicator on the mesh inherits the channel.
TEST_P(Collectives, LateCreditAfterTheDrainLeavesTheMeshHealthy) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    const CommunicatorOptions options = renewable_options();
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, options));
    RF_ASSERT_OK(ex.barrier());
    std::vector<float> buf(2, rank == 0 ? 7.0f : -1.0f);
    if (rank == 0) {
      RF_ASSERT_OK(ex.signal(1, SIGSTOP));  // returns once it is stopped
      RF_ASSERT_OK(node.comm->broadcast(buf.data(), buf.data(), 2, DataType::kF32, 0));
      // Continued from a thread of its own: where revoking a key waits for
      // the peers' confirmation (ucx), it waits for the stopped rank.
      // Where it does not (tcp, verbs), the destruction is waited for, up to 1 s.
      Status resumed;
      std::atomic<bool> destroyed{false};
      std::thread resume([&] {
        std::this_thread::sleep_for(Fabric::kCreditDrain + Millis(300));
        const auto until = std::chrono::steady_clock::now() + Millis(1000);
        while (!destroyed.load() && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(Millis(1));
        }
        resumed = ex.signal(1, SIGCONT);
      });
      node.comm.reset();  // the drain waits for the credit in vain, then revokes
      destroyed.store(true);
      resume.join();
      RF_ASSERT_OK(resumed);
    } else {
      RF_ASSERT_OK(node.comm->broadcast(buf.data(), buf.data(), 2, DataType::kF32, 0));
      RF_ASSERT(buf[0] == 7.0f && buf[1] == 7.0f);
    }
    // The next communicator on the same channels, both ways.
    RF_ASSERT_OK(renew_comm(node, rank, n, options));
    std::vector<float> in(2, static_cast<float>(rank + 1)), out(2);
    for (int call = 0; call < 3; ++call) {
      RF_ASSERT_OK(node.comm->allreduce(in.data(), out.data(), 2, DataType::kF32, ReduceOp::kSum));
      RF_ASSERT(out[0] == 3.0f && out[1] == 3.0f);
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Several collectives in flight at once on different lanes, finished in any
// order, each matched by its tag.
TEST_P(Collectives, AsynchronousCallsInFlightTogether) {
  auto r = run_ranks(4, [&](int rank, int n, Exchange& ex) {
    // Buffers outlive the communicator (declared first, destroyed last).
    std::vector<std::unique_ptr<Mem>> ins, outs;
    CommNode node;
    CommunicatorOptions opts;
    opts.lanes = 4;
    opts.slot_bytes = 16384;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, opts));
    const size_t count = 50000;
    std::vector<Request> reqs;
    for (int k = 0; k < 4; ++k) {
      ins.push_back(std::make_unique<Mem>(count * 4));
      outs.push_back(std::make_unique<Mem>(count * 4 * n));
      test::fill_input(DataType::kF32, ReduceOp::kSum, rank, 100 + k, ins[k]->p, count);
      CallOptions o;
      o.tag = static_cast<uint64_t>(k);
      o.algorithm = k % 2 && k != 3 ? Algorithm::kRabenseifner : Algorithm::kRing;
      if (k == 3) {
        reqs.push_back(node.comm->start_allgather(ins[k]->p, outs[k]->p, count, DataType::kF32, o));
      } else {
        reqs.push_back(node.comm->start_allreduce(ins[k]->p, outs[k]->p, count, DataType::kF32,
                                                  ReduceOp::kSum, o));
      }
    }
    // A blocking call on a lane that also has async work queued.
    Mem bin(8), bout(8);
    test::fill_input(DataType::kI64, ReduceOp::kMax, rank, 9, bin.p, 1);
    CallOptions o;
    o.tag = 1;
    RF_ASSERT_OK(node.comm->allreduce(bin.p, bout.p, 1, DataType::kI64, ReduceOp::kMax, o));
    EXPECT_EQ(test::count_wrong_reduced(DataType::kI64, ReduceOp::kMax, n, 9, bout.p, 1, 0), 0u);
    for (int k = 3; k >= 0; --k) {
      RF_ASSERT_OK(reqs[k].wait());
      EXPECT_TRUE(reqs[k].test());
      std::string first;
      if (k == 3) {
        for (int b = 0; b < n; ++b) {
          EXPECT_EQ(test::count_wrong_input(DataType::kF32, ReduceOp::kSum, b, 100 + k,
                                            outs[k]->p + b * count * 4, count, 0, &first),
                    0u)
              << first;
        }
      } else {
        EXPECT_EQ(test::count_wrong_reduced(DataType::kF32, ReduceOp::kSum, n, 100 + k, outs[k]->p,
                                            count, 0, &first),
                  0u)
            << "request " << k << ": " << first;
      }
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// RDMAFLOW_ALLREDUCE_ALGO forces the algorithm; an unknown name is refused.
TEST_P(Collectives, EnvironmentForcesTheAlgorithm) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    setenv("RDMAFLOW_ALLREDUCE_ALGO", "rabenseifner", 1);
    setenv("RDMAFLOW_BROADCAST_ALGO", "tree", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    auto a = node.comm->select(CollectiveKind::kAllreduce, 1 << 20, DataType::kF32);
    RF_ASSERT_OK(a);
    EXPECT_EQ(*a, Algorithm::kRabenseifner);
    auto b = node.comm->select(CollectiveKind::kBroadcast, 8, DataType::kF32);
    RF_ASSERT_OK(b);
    EXPECT_EQ(*b, Algorithm::kTree);
    // The caller's choice wins over the environment.
    CallOptions o;
    o.algorithm = Algorithm::kRing;
    EXPECT_EQ(*node.comm->select(CollectiveKind::kAllreduce, 8, DataType::kF32, o),
              Algorithm::kRing);
    o.algorithm = Algorithm::kPairwise;
    EXPECT_FALSE(node.comm->select(CollectiveKind::kAllreduce, 8, DataType::kF32, o).is_ok());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Ranks that share cores the launcher cannot see (containers, the namespaces of
// scripts/cluster) are told so as Open MPI's are, with mpi_yield_when_idle: the
// communicator then prices each dependent round (cost_model.h, round) and
// every rank's sends on the shared CPUs (cpus), and polls and yields while it
// waits. Unset, two ranks on a host of two or more cores are not crowded.
TEST_P(Collectives, YieldWhenIdleMarksTheRanksOversubscribed) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 cores: 2 ranks on 1 are crowded";
  for (const char* yield : {"0", "1"}) {
    auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
      setenv("OMPI_MCA_mpi_yield_when_idle", yield, 1);
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
      EXPECT_EQ(node.comm->cost_model().params().round > 0, yield[0] == '1')
          << "OMPI_MCA_mpi_yield_when_idle=" << yield << ": "
          << node.comm->cost_model().params().to_string();
      // Crowded, an allreduce is costed by every rank's sends over the CPUs.
      EXPECT_EQ(node.comm->cost_model().params().cpus,
                yield[0] == '1' ? sysconf(_SC_NPROCESSORS_ONLN) : 0)
          << node.comm->cost_model().params().to_string();
      // And waits by polling every peer (over tcp, GroupDriver::poll) and
      // yielding: every algorithm's result, small and in several pieces.
      for (Algorithm algo : algorithms_for(CollectiveKind::kAllreduce)) {
        if (algo == Algorithm::kHier) continue;  // one host
        for (size_t count : {size_t{2}, size_t{(256 << 10) + 3}}) {
          std::vector<float> in(count), out(count);
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + 1 + i % 7);
          CallOptions o;
          o.algorithm = algo;
          RF_ASSERT_OK(node.comm->allreduce(in.data(), out.data(), count, DataType::kF32,
                                            ReduceOp::kSum, o));
          for (size_t i = 0; i < count; ++i) {
            RF_ASSERT(out[i] == static_cast<float>(3 + 2 * (i % 7)));
          }
        }
      }
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << r.message;
  }
}

// RDMAFLOW_COLL_POLL_US: a rank with a core of its own polls its sockets
// without blocking (GroupDriver::poll over tcp) for that long after progress
// before its drive may sleep. With the poll covering the whole wait (spin and
// poll 60 s), every algorithm's result is right, and a call whose peer never
// joins still fails at its timeout: the poller looks at deadline and peers
// between slices as the sleeper does (over UCX the same through its worker's
// poll, with the direct path off). A negative value is refused.
TEST_P(Collectives, PollingWaitGivesResultsAndStillTimesOut) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 cores: 2 ranks on 1 are crowded";
  for (const char* poll : {"0", "60000000"}) {
    auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
      setenv("RDMAFLOW_COLL_POLL_US", poll, 1);
      setenv("RDMAFLOW_COLL_SPIN_US", "60000000", 1);
      // Same-host UCX peers would take the direct path, which polls words, not
      // the backend (and looks at the deadline only once its spin is over).
      setenv("RDMAFLOW_COLL_DIRECT", "0", 1);
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
      for (Algorithm algo : algorithms_for(CollectiveKind::kAllreduce)) {
        if (algo == Algorithm::kHier) continue;  // one host
        for (size_t count : {size_t{2}, size_t{(1 << 20) + 3}}) {
          CallSpec c{CollectiveKind::kAllreduce, algo, DataType::kF32, ReduceOp::kSum, count};
          RF_ASSERT_OK(
              check_call(*node.comm, c, std::string("RDMAFLOW_COLL_POLL_US=") + poll + " "));
        }
      }
      RF_ASSERT_OK(ex.barrier());
      if (rank == 1) {  // never joins the next call
        RF_ASSERT_OK(ex.barrier());
        return 0;
      }
      std::vector<float> in(4096, 1.0f), out(4096);
      CallOptions o;
      o.timeout = Millis(500);
      const auto t0 = std::chrono::steady_clock::now();
      Status st =
          node.comm->allreduce(in.data(), out.data(), in.size(), DataType::kF32, ReduceOp::kSum, o);
      const auto took = std::chrono::steady_clock::now() - t0;
      EXPECT_EQ(st.code(), Code::kTimeout) << st.to_string();
      EXPECT_EQ(st.peer(), 1) << st.to_string();
      EXPECT_LT(took, std::chrono::milliseconds(10000)) << st.to_string();  // not the 60 s spin
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << r.message;
  }
  // One rank: with two, the first to refuse exits and closes its channels
  // while the other may still be connecting.
  auto r = run_ranks(1, [&](int rank, int n, Exchange& ex) {
    setenv("RDMAFLOW_COLL_POLL_US", "-1", 1);
    CommNode node;
    Status st = make_comm_node(backend(), rank, n, ex, node);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("RDMAFLOW_COLL_POLL_US"), std::string::npos) << st.to_string();
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// RDMAFLOW_COLL_CACHE_BYTES (the cache the cost model's gamma_at assumes): a
// value out of range or not a number is refused at creation, naming the knob,
// on a communicator of one rank too (which measures nothing); a good one is
// taken.
TEST_P(Collectives, BadCacheBytesAreRefused) {
  auto r = run_ranks(1, [&](int rank, int n, Exchange& ex) {
    for (const char* bad : {"100", "abc", "2000000000000000"}) {
      setenv("RDMAFLOW_COLL_CACHE_BYTES", bad, 1);
      CommNode node;
      Status st = make_comm_node(backend(), rank, n, ex, node);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad << ": " << st.to_string();
      EXPECT_NE(st.to_string().find("RDMAFLOW_COLL_CACHE_BYTES"), std::string::npos)
          << st.to_string();
    }
    setenv("RDMAFLOW_COLL_CACHE_BYTES", "65536", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// A rank that dies: the others' collective fails within its deadline, with an
// error naming the collective and a peer; later calls fail at once.
TEST_P(Collectives, DeadPeerIsNamedAndBreaksTheCommunicator) {
  RunOptions ro;
  ro.may_be_killed = {2};
  auto r = run_ranks(
      3,
      [&](int rank, int n, Exchange& ex) {
        CommNode node;
        RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
        RF_ASSERT_OK(ex.barrier());
        if (rank == 2) {
          pause();  // killed by rank 0
          return 0;
        }
        if (rank == 0) RF_ASSERT_OK(ex.kill(2));
        std::vector<float> in(4096, 1.0f), out(4096);
        CallOptions o;
        o.algorithm = Algorithm::kRing;
        o.timeout = Millis(3000);
        const auto t0 = std::chrono::steady_clock::now();
        Status st = node.comm->allreduce(in.data(), out.data(), in.size(), DataType::kF32,
                                         ReduceOp::kSum, o);
        const auto took = std::chrono::steady_clock::now() - t0;
        EXPECT_FALSE(st.is_ok());
        EXPECT_NE(st.to_string().find("allreduce[ring]"), std::string::npos) << st.to_string();
        EXPECT_GE(st.peer(), 0) << st.to_string();
        EXPECT_LT(took, std::chrono::milliseconds(8000));
        Status again = node.comm->barrier();
        EXPECT_FALSE(again.is_ok());
        return 0;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// One of 4 ranks killed (SIGKILL) in the middle of a loop of ring allreduces:
// every survivor fails soon after, naming the dead rank, including rank 0,
// whose ring neighbours (1 and 3) are alive and only stall: a dead peer's
// channel fails the call even where the schedule never talks to it.
TEST_P(Collectives, KilledRankIsNamedByEverySurvivor) {
  RunOptions ro;
  ro.may_be_killed = {2};
  auto r = run_ranks(
      4,
      [&](int rank, int n, Exchange& ex) {
        CommNode node;
        RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
        RF_ASSERT_OK(ex.barrier());
        std::vector<float> in(65536, 1.0f), out(65536);
        CallOptions o;
        o.algorithm = Algorithm::kRing;
        o.timeout = Millis(20000);
        std::optional<DelayedKill> killer;
        if (rank == 0) killer.emplace(ex, 2);
        Status st;
        while (st.is_ok()) {
          st = node.comm->allreduce(in.data(), out.data(), in.size(), DataType::kF32,
                                    ReduceOp::kSum, o);
        }
        const auto failed_at = std::chrono::steady_clock::now();
        if (killer) {
          // Well within the 20 s timeout: the dead peer is noticed, not waited out.
          EXPECT_LT(killer->before(failed_at), std::chrono::milliseconds(5000)) << st.to_string();
        }
        EXPECT_EQ(st.peer(), 2) << "rank " << rank << ": " << st.to_string();
        EXPECT_NE(st.to_string().find("allreduce[ring]"), std::string::npos) << st.to_string();
        // Survivors leave together, so none sees another survivor's exit first.
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// abort() from another thread fails a pending collective at once (its timeout
// is 30 s and its peer never joins), with kCancelled naming the reason; the
// communicator is broken afterwards.
TEST_P(Collectives, AbortFailsPendingCallsAtOnce) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    RF_ASSERT_OK(ex.barrier());
    if (rank == 1) {  // never joins the allreduce
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    std::vector<float> in(1 << 20, 1.0f), out(1 << 20);
    CallOptions o;
    o.timeout = Millis(30000);
    Request first = node.comm->start_allreduce(in.data(), out.data(), in.size(), DataType::kF32,
                                               ReduceOp::kSum, o);
    Request queued =
        node.comm->start_allreduce(in.data(), out.data(), 8, DataType::kF32, ReduceOp::kSum, o);
    std::this_thread::sleep_for(Millis(200));
    EXPECT_FALSE(first.test());
    const auto t0 = std::chrono::steady_clock::now();
    node.comm->abort("watchdog");
    Status st = first.wait(Millis(2000));
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(st.code(), Code::kCancelled) << st.to_string();
    EXPECT_NE(st.to_string().find("aborted: watchdog"), std::string::npos) << st.to_string();
    EXPECT_LT(took, std::chrono::milliseconds(500)) << st.to_string();
    EXPECT_EQ(queued.wait(Millis(2000)).code(), Code::kCancelled);
    Status later = node.comm->barrier();
    EXPECT_EQ(later.code(), Code::kCancelled) << later.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Same-host peers over UCX take the fabric's direct path (memcpy + sequence
// words, no channel writes); RDMAFLOW_COLL_DIRECT=0 (or the option) keeps the
// notify path; both give the same results. TCP never maps peer memory.
TEST_P(Collectives, DirectPathOnSharedMemoryAndItsKnob) {
  for (int mode : {1, 0, 2}) {  // 1: default, 0: RDMAFLOW_COLL_DIRECT=0, 2: option false
    auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
      if (mode == 0) setenv("RDMAFLOW_COLL_DIRECT", "0", 1);
      CommunicatorOptions co;
      if (mode == 2) co.direct = false;
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, co));
      const bool direct = mode == 1 && backend().backend == "ucx";
      EXPECT_EQ(node.comm->stats().direct_peers, direct ? 1 : 0);
      for (size_t count : {size_t{2}, size_t{1000}, size_t{300000}}) {
        for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
          CallSpec c{CollectiveKind::kAllreduce, a, DataType::kF32, ReduceOp::kSum, count};
          RF_ASSERT_OK(check_call(*node.comm, c));
        }
      }
      const FabricStats st = node.comm->stats();
      if (direct) {
        EXPECT_GT(st.direct_pieces, 0u);
        EXPECT_EQ(st.notify_pieces, 0u);
      } else {
        EXPECT_EQ(st.direct_pieces, 0u);
        EXPECT_GT(st.notify_pieces, 0u);
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << "mode " << mode << ": " << r.message;
  }
}

// Receives that copy a piece out of its slot have tcp put the piece where it
// goes (FabricConfig::land_min, Channel::post_landing); the results are the
// same with RDMAFLOW_COLL_LAND_MIN=0, which keeps every piece in its slot,
// and a bad value is refused naming the knob. Backends without landings
// (UCX, verbs) land nothing.
TEST_P(Collectives, PiecesLandWhereTheyGoAndItsKnob) {
  auto bad = run_ranks(1, [&](int rank, int n, Exchange& ex) {
    for (const char* knob : {"-1", "lots", "2000000000000000"}) {
      setenv("RDMAFLOW_COLL_LAND_MIN", knob, 1);
      CommNode node;
      Status made = make_comm_node(backend(), rank, n, ex, node);
      EXPECT_EQ(made.code(), Code::kInvalidArgument) << knob << ": " << made.to_string();
      EXPECT_NE(made.to_string().find("RDMAFLOW_COLL_LAND_MIN"), std::string::npos)
          << made.to_string();
    }
    return 0;
  });
  if (bad.skipped) GTEST_SKIP() << bad.message;
  ASSERT_TRUE(bad.ok) << bad.message;
  for (const char* knob : {"", "0"}) {
    auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
      if (*knob != '\0') setenv("RDMAFLOW_COLL_LAND_MIN", knob, 1);
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
      for (size_t count : {size_t{5000}, size_t{300001}}) {
        for (bool in_place : {false, true}) {
          for (Algorithm a : {Algorithm::kRing, Algorithm::kRabenseifner, Algorithm::kTree}) {
            CallSpec c{CollectiveKind::kAllreduce, a, DataType::kF32, ReduceOp::kSum, count};
            c.in_place = in_place;
            RF_ASSERT_OK(check_call(*node.comm, c));
          }
          for (CollectiveKind k : {CollectiveKind::kAllgather, CollectiveKind::kBroadcast}) {
            CallSpec c{k, Algorithm::kRing, DataType::kF32, ReduceOp::kSum, count};
            if (k == CollectiveKind::kBroadcast) c.algo = Algorithm::kTree;
            c.in_place = in_place;
            c.root = 1;
            RF_ASSERT_OK(check_call(*node.comm, c));
          }
        }
      }
      const FabricStats st = node.comm->stats();
      const bool lands = backend().backend == "tcp" && *knob == '\0';
      if (lands) {
        EXPECT_GT(st.landed_pieces, 0u);
      } else {
        EXPECT_EQ(st.landed_pieces, 0u);
        EXPECT_EQ(st.landing_copied_bytes, 0u);
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << "RDMAFLOW_COLL_LAND_MIN='" << knob << "': " << r.message;
  }
}

// Direct and channel peers in one communicator: rank 2 turns the direct path
// off, so over UCX only the pair (0, 1) takes it; every algorithm still agrees.
TEST_P(Collectives, DirectAndChannelPeersMix) {
  auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
    if (rank == 2) setenv("RDMAFLOW_COLL_DIRECT", "0", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    const bool ucx = backend().backend == "ucx";
    EXPECT_EQ(node.comm->stats().direct_peers, ucx && rank != 2 ? 1 : 0);
    for (size_t count : {size_t{3}, size_t{5000}, size_t{300001}}) {
      for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kRabenseifner,
                          Algorithm::kTree}) {
        CallSpec c{CollectiveKind::kAllreduce, a, DataType::kF32, ReduceOp::kSum, count};
        RF_ASSERT_OK(check_call(*node.comm, c));
      }
    }
    const FabricStats st = node.comm->stats();
    EXPECT_GT(st.notify_pieces, 0u);
    if (ucx && rank != 2) {
      EXPECT_GT(st.direct_pieces, 0u);
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// A peer killed (SIGKILL) while the survivor is inside an allreduce with it:
// the survivor's call fails soon after, well within its deadline, naming the
// collective and the dead peer (on UCX between same-host ranks this is the
// direct path, where nothing travels through the channel).
TEST_P(Collectives, PeerKilledMidAllreduceFailsTheSurvivor) {
  RunOptions ro;
  ro.may_be_killed = {1};
  auto r = run_ranks(
      2,
      [&](int rank, int n, Exchange& ex) {
        CommNode node;
        RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
        RF_ASSERT_OK(ex.barrier());
        std::vector<float> in(16384, 1.0f), out(16384);
        CallOptions o;
        o.timeout = Millis(10000);
        if (rank == 1) {
          for (;;) {  // until killed
            Status st = node.comm->allreduce(in.data(), out.data(), in.size(), DataType::kF32,
                                             ReduceOp::kSum, o);
            if (!st.is_ok()) pause();
          }
        }
        DelayedKill killer(ex, 1);
        Status st;
        int calls = 0;
        while (st.is_ok()) {
          st = node.comm->allreduce(in.data(), out.data(), in.size(), DataType::kF32,
                                    ReduceOp::kSum, o);
          if (st.is_ok()) ++calls;
        }
        EXPECT_LT(killer.before(std::chrono::steady_clock::now()), std::chrono::milliseconds(5000))
            << st.to_string();
        EXPECT_GT(calls, 0);
        EXPECT_NE(st.to_string().find("allreduce"), std::string::npos) << st.to_string();
        EXPECT_EQ(st.peer(), 1) << st.to_string();
        if (backend().backend == "ucx") {
          EXPECT_EQ(node.comm->stats().direct_peers, 1);
        }
        EXPECT_FALSE(node.comm->barrier().is_ok());
        return 0;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Bad arguments are refused with an error, never a crash.
TEST_P(Collectives, BadArgumentsAreRefused) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    float x = 1, y = 0;
    EXPECT_EQ(node.comm->allreduce(nullptr, &y, 1, DataType::kF32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(node.comm->broadcast(&x, &y, 1, DataType::kF32, 5).code(), Code::kInvalidArgument);
    EXPECT_EQ(node.comm->allreduce(&x, &y, 1, DataType::kBool, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    // Still usable afterwards.
    RF_ASSERT_OK(node.comm->allreduce(&x, &y, 1, DataType::kF32, ReduceOp::kSum));
    EXPECT_EQ(y, 2.0f);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// A scratch key over the receiver's RDMAFLOW_MAX_KEY_BYTES (32 on rank 0, below
// a tcp key's 52 bytes) fails rank 0's Communicator::create naming the knob and
// the peer that sent it, before the key is parsed or used; rank 1 does not hang.
// tcp only: the limit is the decoder's, the same for every backend.
TEST(CollectivesLimits, AScratchKeyOverTheReceiversLimitFailsCreationNamingThePeer) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    if (rank == 0) ::setenv("RDMAFLOW_MAX_KEY_BYTES", "32", 1);
    auto node = std::make_unique<CommNode>();
    CommunicatorOptions options;
    options.timeout = Millis(5000);
    const auto t0 = std::chrono::steady_clock::now();
    Status st = make_comm_node(backend_row("tcp"), rank, n, ex, *node, options);
    node.reset();  // rank 0's channels close: rank 1 learns at once
    EXPECT_FALSE(st.is_ok());
    if (rank == 0) {
      EXPECT_EQ(st.code(), Code::kProtocolError) << st.to_string();
      EXPECT_EQ(st.peer(), 1) << st.to_string();
      EXPECT_NE(st.reason().find("RDMAFLOW_MAX_KEY_BYTES=32"), std::string::npos) << st.to_string();
      EXPECT_NE(st.reason().find("from rank 1"), std::string::npos) << st.to_string();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, Millis(15000)) << st.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::ValuesIn(backend_rows()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace rdmaflow::testing
