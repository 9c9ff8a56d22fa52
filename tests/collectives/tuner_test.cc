// The tuner (collectives/tuner.h) in real processes over TCP: every rank
// takes the same algorithm for the same call during the trial and after it,
// results stay right while candidates alternate (sizes on both sides of a
// bucket's edge, two calls in flight on the two lanes), RDMAFLOW_COLL_TUNE and
// RDMAFLOW_COLL_TUNE_MIN_BYTES are checked, and of a near tie in the model where one candidate
// took far longer (times fed to the trial) the tuner keeps the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

BackendRow tcp() {
  return backend_row("tcp");
}

// This rank's outcome of the bucket of `count` elements of f32 as text, the
// same on every rank when they agreed.
std::string outcome_text(const Communicator& comm, CollectiveKind kind, size_t count) {
  auto o = comm.tuned(kind, count, DataType::kF32);
  if (!o) return "untuned";
  std::string s = std::string(algorithm_name(o->winner)) + ":";
  for (size_t c = 0; c < o->candidates.size(); ++c) {
    s += " " + std::string(algorithm_name(o->candidates[c])) + "=" + std::to_string(o->nanos[c]);
  }
  return s;
}

// Two timed trial calls per candidate (blocks of three); sizes on both sides of the edges of the
// 4 KiB and 64 KiB buckets; every other step two calls in flight at once on
// the two lanes. Each call's result is checked, each nonblocking call's
// algorithm logged; the logs and the outcomes are compared across ranks.
TEST(Tuner, EveryRankTakesTheSameAlgorithmAndResultsStayRight) {
  auto r = run_ranks(4, [&](int rank, int n, Exchange& ex) {
    setenv("RDMAFLOW_COLL_TUNE", "2", 1);
    setenv("RDMAFLOW_COLL_TUNE_MIN_BYTES", "0", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
    Communicator& comm = *node.comm;
    const size_t counts[] = {1000, 1025, 16384, 16385};
    std::string log;
    for (size_t count : counts) {
      for (int step = 0; step < 12; ++step) {
        const uint32_t seed = static_cast<uint32_t>(count + step);
        if (step % 2 == 0) {
          std::string first;
          CallSpec c{CollectiveKind::kAllreduce, Algorithm::kAuto, DataType::kF32, ReduceOp::kSum,
                     count};
          c.seed = seed;
          auto wrong = run_and_check(comm, c, &first);
          RF_ASSERT_OK(wrong);
          EXPECT_EQ(*wrong, 0u) << "count " << count << " step " << step << ": " << first;
          continue;
        }
        Mem in[2], out[2];
        Request req[2];
        for (int k = 0; k < 2; ++k) {
          in[k].resize(count * 4);
          out[k].resize(count * 4);
          test::make_input(CollectiveKind::kAllreduce, DataType::kF32, ReduceOp::kSum, rank, n,
                           seed + 1000 * k, in[k].p, count);
          req[k] = comm.start_allreduce(in[k].p, out[k].p, count, DataType::kF32, ReduceOp::kSum);
        }
        for (int k = 0; k < 2; ++k) {
          RF_ASSERT_OK(req[k].wait());
          log += std::string(algorithm_name(req[k].algorithm())) + " ";
          std::string first;
          EXPECT_EQ(test::check_output(CollectiveKind::kAllreduce, DataType::kF32, ReduceOp::kSum,
                                       rank, n, 0, seed + 1000 * k, out[k].p, count, &first),
                    0u)
              << "count " << count << " step " << step << " call " << k << ": " << first;
        }
      }
      // Eighteen calls per size cover the warm-up block, blocks of three
      // calls for up to four candidates and the decision: the bucket is
      // settled, and select() says so.
      auto o = comm.tuned(CollectiveKind::kAllreduce, count, DataType::kF32);
      EXPECT_TRUE(o.has_value()) << "count " << count;
      if (o) {
        EXPECT_EQ(*comm.select(CollectiveKind::kAllreduce, count, DataType::kF32), o->winner);
      }
      log += "| " + outcome_text(comm, CollectiveKind::kAllreduce, count) + "\n";
    }
    auto all = ex.allgather(log);
    RF_ASSERT_OK(all);
    for (int p = 1; p < n; ++p) {
      EXPECT_EQ((*all)[p], (*all)[0]) << "rank " << p << " took other algorithms than rank 0";
    }
    if (rank == 0) std::fprintf(stderr, "%s", log.c_str());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Bad RDMAFLOW_COLL_TUNE and RDMAFLOW_COLL_TUNE_MIN_BYTES values are refused
// naming the knob; 0 turns the tuner off, a forced algorithm is never tuned,
// and calls under the least size are not tuned while those at it are.
TEST(Tuner, KnobsAreCheckedAndZeroTurnsItOff) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
    const std::pair<const char*, std::vector<const char*>> knobs[] = {
        {"RDMAFLOW_COLL_TUNE", {"-1", "101", "two"}},
        {"RDMAFLOW_COLL_TUNE_MIN_BYTES", {"-1", "2199023255553", "4M"}}};
    for (const auto& [knob, bads] : knobs) {
      for (const char* bad : bads) {
        setenv(knob, bad, 1);
        Status st = renew_comm(node, rank, n);
        EXPECT_FALSE(st.is_ok()) << knob << "='" << bad << "' accepted";
        EXPECT_NE(st.to_string().find(knob), std::string::npos) << st.to_string();
      }
      unsetenv(knob);
    }
    // Calls of `count` f32, enough for any trial (twelve with 1 trial a
    // candidate): whether they left an outcome.
    auto settled = [&](const char* tune, const char* min_bytes, Algorithm algo,
                       size_t count) -> Result<bool> {
      setenv("RDMAFLOW_COLL_TUNE", tune, 1);
      setenv("RDMAFLOW_COLL_TUNE_MIN_BYTES", min_bytes, 1);
      RDMAFLOW_RETURN_IF_ERROR(renew_comm(node, rank, n));
      std::string first;
      // By time, up to the most trials per candidate, stopping once settled.
      const size_t calls = std::string(tune) == "auto" ? Tuner::kMostTrialCalls + 1 : 12;
      for (size_t i = 0;
           i < calls && !node.comm->tuned(CollectiveKind::kAllreduce, count, DataType::kF32); ++i) {
        CallSpec c{CollectiveKind::kAllreduce, algo, DataType::kF32, ReduceOp::kSum, count};
        RDMAFLOW_ASSIGN_OR_RETURN(size_t wrong, run_and_check(*node.comm, c, &first));
        EXPECT_EQ(wrong, 0u) << first;
      }
      EXPECT_EQ(node.comm->tuning(CollectiveKind::kAllreduce, count, DataType::kF32),
                std::string(tune) != "0" && count * 4 >= std::stoull(min_bytes));
      return node.comm->tuned(CollectiveKind::kAllreduce, count, DataType::kF32).has_value();
    };
    const auto expect = [](Result<bool> got, bool want, const char* what) {
      RF_ASSERT_OK(got.status());
      EXPECT_EQ(*got, want) << what;
      return 0;
    };
    expect(settled("0", "0", Algorithm::kAuto, 4096), false, "RDMAFLOW_COLL_TUNE=0");
    expect(settled("1", "0", Algorithm::kRing, 4096), false, "a forced algorithm");
    expect(settled("1", "65536", Algorithm::kAuto, 4096), false, "16 KiB under 64 KiB");
    expect(settled("1", "65536", Algorithm::kAuto, 16384), true, "64 KiB at 64 KiB");
    expect(settled("auto", "65536", Algorithm::kAuto, 16384), true, "auto, 64 KiB at 64 KiB");
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// By time (RDMAFLOW_COLL_TUNE unset or auto), a bucket gets as many trial
// calls per candidate as its cheapest estimate fits in the budget, between
// the least and the most; a number fixes them.
TEST(Tuner, TrialsByTimeFitTheBudget) {
  const Tuner by_time(Tuner::kByTime), fixed(5);
  const double budget = Tuner::kBudgetSeconds;
  EXPECT_EQ(by_time.trials_for(budget / 50), 50);
  EXPECT_EQ(by_time.trials_for(budget / 49.5), 50);  // rounded up
  EXPECT_EQ(by_time.trials_for(budget), Tuner::kMinTrials);
  EXPECT_EQ(by_time.trials_for(10.0), Tuner::kMinTrials);
  EXPECT_EQ(by_time.trials_for(1e-9), Tuner::kMaxTrials);
  EXPECT_EQ(by_time.trials_for(0), Tuner::kMaxTrials);
  EXPECT_EQ(fixed.trials_for(budget / 50), 5);
  EXPECT_EQ(fixed.trials_for(10.0), 5);
}

// A near tie in the model with a real gap: with a round of one second every
// estimate is its rounds, so reduce_scatter's two-round schedules tie on 4
// ranks: Rabenseifner (halving: 3/4 of the buffer sent) and recursive
// doubling (an allreduce of the whole buffer: twice the buffer sent and
// reduced). At 16 MiB the second took 1.57x as long in real calls on a quiet
// 2-core host (54.5 against 34.8 ms). The trial is fed those times, with one
// timed call of each disturbed the other way (a burst of other work on
// Rabenseifner's, a lucky one of recursive doubling's), and must keep
// Rabenseifner by the medians. Timed in real processes instead, this test
// failed twice in CI: the other tests beside it (ctest -j 2 on 2 cores) made
// recursive doubling's five calls faster than Rabenseifner's (82 against 121
// ms). Which one real calls favour is the benchmarks' to say (the targets
// run's "selector within 10% of the fastest", docs/benchmarks.md); here, the
// choice the tuner makes of the times it measured.
TEST(Tuner, KeepsTheFasterOfANearTie) {
  constexpr int kTrials = 5;
  CostParams params;
  params.round = 1.0;
  const CostModel model(4, params);
  const size_t bytes = size_t{16} << 20;  // reduce_scatter's input: 4 MiB a rank
  const auto ranked = model.ranked(CollectiveKind::kReduceScatter, bytes);
  ASSERT_FALSE(ranked.empty());
  std::vector<Algorithm> close;
  for (const auto& c : ranked) {
    if (c.seconds <= Tuner::kFactor * ranked.front().seconds) close.push_back(c.algo);
  }
  ASSERT_NE(std::find(close.begin(), close.end(), Algorithm::kRecursiveDoubling), close.end());
  ASSERT_NE(std::find(close.begin(), close.end(), Algorithm::kRabenseifner), close.end());

  Tuner tuner(kTrials);
  const Tuner::Agree agree = [](std::vector<int64_t>&) { return Status::ok(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::map<Algorithm, int> timed;  // timed calls handed out per candidate
  auto fed = [&](const Tuner::Pick& p) {
    const int k = p.warmup ? -1 : timed[p.algo]++;
    if (p.algo == Algorithm::kRabenseifner) return k == 0 ? 0.200 : 0.0348;
    if (p.algo == Algorithm::kRecursiveDoubling) return k == 1 ? 0.020 : 0.0545;
    return 0.080;  // any other candidate: slower than both
  };
  std::optional<Algorithm> decided;
  for (size_t i = 0; i <= Tuner::kMostTrialCalls && !decided; ++i) {
    auto p = tuner.pick(CollectiveKind::kReduceScatter, bytes, model, deadline, agree);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    if (p->entry == nullptr) {
      decided = p->algo;
      break;
    }
    tuner.record(*p, fed(*p));
  }
  ASSERT_TRUE(decided.has_value()) << "no decision after the trial's calls";
  auto o = tuner.outcome(CollectiveKind::kReduceScatter, bytes);
  ASSERT_TRUE(o.has_value());
  const std::string what = Tuner::describe(CollectiveKind::kReduceScatter, *o);
  EXPECT_EQ(o->winner, Algorithm::kRabenseifner) << what;
  EXPECT_EQ(*decided, Algorithm::kRabenseifner) << what;
  EXPECT_EQ(o->trials, kTrials) << what;
  for (size_t c = 0; c < o->candidates.size(); ++c) {
    EXPECT_EQ(timed[o->candidates[c]], kTrials) << algorithm_name(o->candidates[c]);
    // The medians: the disturbed call moved neither.
    if (o->candidates[c] == Algorithm::kRabenseifner) {
      EXPECT_EQ(o->nanos[c], 34800000) << what;
    }
    if (o->candidates[c] == Algorithm::kRecursiveDoubling) {
      EXPECT_EQ(o->nanos[c], 54500000) << what;
    }
  }
  // The bucket keeps it: the next call is no trial.
  auto next = tuner.pick(CollectiveKind::kReduceScatter, bytes, model, deadline, agree);
  ASSERT_TRUE(next.is_ok());
  EXPECT_EQ(next->algo, Algorithm::kRabenseifner);
  EXPECT_EQ(next->entry, nullptr);
}

}  // namespace
}  // namespace rdmaflow::testing
