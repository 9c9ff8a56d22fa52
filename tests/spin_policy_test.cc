// SpinPolicy (common/spin_policy.h): how the spin budget follows what spins achieve.
// Pure logic on made-up time points; the effect on latency is measured by
// bench/p2p --load (docs/benchmarks.md).
#include "common/spin_policy.h"

#include <gtest/gtest.h>

namespace rdmaflow {
namespace {

using Clock = SpinPolicy::Clock;
using Outcome = SpinPolicy::Outcome;
using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr auto kMax = microseconds(50);

Clock::time_point at(Clock::duration d) {
  return Clock::time_point(d);
}

TEST(SpinPolicy, QuietMachineKeepsTheFullBudget) {
  SpinPolicy p(kMax);
  bool probe = true;
  for (int i = 0; i < 100; ++i) {
    const auto b = p.budget(at(microseconds(10 * i)), &probe);
    EXPECT_EQ(b, kMax);
    EXPECT_FALSE(probe);
    p.record(b, probe, Outcome::kHit, at(microseconds(10 * i + 1)));
  }
}

TEST(SpinPolicy, MissesHalveTheBudgetDownToBlocking) {
  SpinPolicy p(kMax);
  bool probe = false;
  auto b = p.budget(at(microseconds(0)), &probe);
  int misses = 0;
  while (b > Clock::duration::zero()) {
    p.record(b, probe, Outcome::kMiss, at(microseconds(1)));
    const auto next = p.budget(at(microseconds(2)), &probe);
    EXPECT_LT(next, b);
    b = next;
    ASSERT_LT(++misses, 10);
  }
  EXPECT_GE(misses, 5);  // 50 us halved to below 1 us
  EXPECT_FALSE(probe);
}

TEST(SpinPolicy, PreemptedSpinBlocksUntilTheProbe) {
  SpinPolicy p(kMax);
  bool probe = false;
  auto b = p.budget(at(milliseconds(10)), &probe);
  p.record(b, probe, Outcome::kPreempted, at(milliseconds(10)));
  EXPECT_EQ(p.budget(at(milliseconds(10) + microseconds(10)), &probe), Clock::duration::zero());
  EXPECT_FALSE(probe);
  // The probe spins the full budget, once.
  const auto later = at(milliseconds(10) + SpinPolicy::kFirstProbe);
  EXPECT_EQ(p.budget(later, &probe), kMax);
  EXPECT_TRUE(probe);
  bool again = false;
  EXPECT_EQ(p.budget(later, &again), Clock::duration::zero());
  EXPECT_FALSE(again);
  // A probe that hits brings the full budget back.
  p.record(kMax, true, Outcome::kHit, later);
  EXPECT_EQ(p.budget(later, &again), kMax);
  EXPECT_FALSE(again);
}

TEST(SpinPolicy, PreemptedProbesBackOffToOncePerSecond) {
  SpinPolicy p(kMax);
  bool probe = false;
  auto t = at(milliseconds(1));
  p.record(p.budget(t, &probe), probe, Outcome::kPreempted, t);
  auto every = SpinPolicy::kFirstProbe;
  for (int i = 0; i < 20; ++i) {
    // Nothing before the interval is over, the probe at its end.
    EXPECT_EQ(p.budget(t + every - microseconds(1), &probe), Clock::duration::zero());
    t += every;
    ASSERT_EQ(p.budget(t, &probe), kMax);
    ASSERT_TRUE(probe);
    p.record(kMax, true, Outcome::kPreempted, t);
    every = std::min<Clock::duration>(every * 2, SpinPolicy::kLastProbe);
  }
  EXPECT_EQ(every, SpinPolicy::kLastProbe);
  // A long run of hits says the machine is quiet: back to the first interval.
  t += every;
  ASSERT_EQ(p.budget(t, &probe), kMax);
  p.record(kMax, true, Outcome::kHit, t);
  for (int i = 0; i < SpinPolicy::kQuietHits; ++i) {
    p.record(p.budget(t, &probe), probe, Outcome::kHit, t);
  }
  p.record(p.budget(t, &probe), probe, Outcome::kPreempted, t);
  EXPECT_EQ(p.budget(t + SpinPolicy::kFirstProbe, &probe), kMax);
  EXPECT_TRUE(probe);
}

TEST(SpinPolicy, ZeroMaximumNeverSpins) {
  SpinPolicy p(Clock::duration::zero());
  bool probe = true;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.budget(at(std::chrono::seconds(10 * i)), &probe), Clock::duration::zero());
    EXPECT_FALSE(probe);
  }
}

TEST(SpinPolicy, WatchSeesGapsOnlyBetweenIdlePolls) {
  SpinPolicy::Watch w(at(microseconds(0)));
  EXPECT_FALSE(w.note(at(microseconds(2)), false));
  EXPECT_FALSE(w.note(at(microseconds(500)), true));  // the poll worked that long
  EXPECT_TRUE(w.note(at(microseconds(600)), false));  // 100 us off the CPU
  EXPECT_FALSE(w.note(at(microseconds(601)), false));
}

}  // namespace
}  // namespace rdmaflow
