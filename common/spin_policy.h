// SpinPolicy: how long a waiting thread polls before it sleeps on a kernel
// primitive, learned from what its recent spins achieved.
//
// Spinning wins only while the waiter and the thread that will answer it each
// have a core: the answer then lands during the spin, a fraction of a
// microsecond after it was published. When other work wants the CPUs, a spin
// loses twice. The answer is slower than the spin (the peer first has to be
// scheduled), so the spin is pure overhead; and a thread that spins uses up
// its fair share, so the scheduler no longer runs it promptly when it is woken
// (a thread that mostly sleeps is run at once), and a spinner that is
// preempted misses the answer by a whole time slice (milliseconds) because
// nobody wakes a thread that never went to sleep. A sleeping waiter woken by
// the kernel keeps the socket's latency under any load.
//
// So the budget adapts:
//  - a spin that got its answer (hit) doubles the budget, up to the maximum;
//  - a spin that ran out (miss) halves it, down to nothing (block at once);
//  - a spin during which the thread lost its CPU (preempted: a long gap
//    between two polls that did no work, or a long yield) ends at once and
//    drops the budget to nothing;
//  - while the budget is nothing, one wait in a while spins for the full
//    budget (a probe: every 1 ms, doubling up to 1 s with each preempted
//    probe, back to 1 ms after a long run of hits), so a machine that went
//    quiet gets the spin back within milliseconds.
// A quiet machine keeps the full budget (every spin hits); a loaded one
// settles on blocking with a rare probe.
//
// Thread-safe (relaxed atomics): the waiters of one transport share a policy;
// a lost update only delays the adaptation by one wait.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace rdmaflow {

class SpinPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Outcome { kHit, kMiss, kPreempted };

  // A poll loop that sees this much time pass between two polls that did
  // nothing was not running in between.
  static constexpr Clock::duration kPreemptGap = std::chrono::microseconds(30);
  // Budgets below this are not worth a spin.
  static constexpr Clock::duration kMinSpin = std::chrono::microseconds(1);
  static constexpr Clock::duration kFirstProbe = std::chrono::milliseconds(1);
  static constexpr Clock::duration kLastProbe = std::chrono::seconds(1);
  static constexpr int kQuietHits = 64;

  explicit SpinPolicy(Clock::duration max = std::chrono::microseconds(50))
      : max_(max.count()), budget_(max.count()), probe_every_(kFirstProbe.count()) {}

  Clock::duration max() const { return Clock::duration(max_); }

  // The spin for a wait starting at `now`; zero: sleep at once. `*probe` tells
  // whether this is a probe (pass it back to record()).
  Clock::duration budget(Clock::time_point now, bool* probe) {
    *probe = false;
    const int64_t b = budget_.load(std::memory_order_relaxed);
    if (b > 0 || max_ == 0) return Clock::duration(b);
    const int64_t t = now.time_since_epoch().count();
    int64_t due = next_probe_.load(std::memory_order_relaxed);
    if (t < due) return Clock::duration::zero();
    // One waiter probes; the others keep sleeping at once.
    if (!next_probe_.compare_exchange_strong(due, t + probe_every_.load(std::memory_order_relaxed),
                                             std::memory_order_relaxed)) {
      return Clock::duration::zero();
    }
    *probe = true;
    return Clock::duration(max_);
  }

  // What the spin of `budget` (from budget()) came to.
  void record(Clock::duration budget, bool probe, Outcome outcome, Clock::time_point now) {
    const int64_t b = budget.count();
    const int64_t t = now.time_since_epoch().count();
    switch (outcome) {
      case Outcome::kPreempted: {
        // Lost the CPU while spinning: block from now on; probe less often
        // while probes are preempted too.
        budget_.store(0, std::memory_order_relaxed);
        hits_.store(0, std::memory_order_relaxed);
        int64_t every = probe_every_.load(std::memory_order_relaxed);
        if (probe) {
          every = std::min<int64_t>(every * 2, kLastProbe.count());
          probe_every_.store(every, std::memory_order_relaxed);
        }
        next_probe_.store(t + every, std::memory_order_relaxed);
        return;
      }
      case Outcome::kHit:
        // A probe that hit found a peer answering within the full budget:
        // spin for all of it (on a quiet machine that costs nobody anything).
        budget_.store(probe ? max_ : std::min(std::max(b, kMinSpin.count()) * 2, max_),
                      std::memory_order_relaxed);
        // A long run of hits says the machine is quiet again: probe at the
        // first interval next time.
        if (hits_.fetch_add(1, std::memory_order_relaxed) + 1 >= kQuietHits) {
          probe_every_.store(kFirstProbe.count(), std::memory_order_relaxed);
        }
        return;
      case Outcome::kMiss: {
        hits_.store(0, std::memory_order_relaxed);
        const int64_t halved = probe ? 0 : b / 2;
        if (halved >= kMinSpin.count()) {
          budget_.store(halved, std::memory_order_relaxed);
          return;
        }
        budget_.store(0, std::memory_order_relaxed);
        next_probe_.store(t + probe_every_.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
        return;
      }
    }
  }

  // Watches one spin for preemption: call note() after each poll.
  class Watch {
   public:
    explicit Watch(Clock::time_point start) : last_(start) {}
    // `now`: the time after a poll; `did_work`: the poll found something to do
    // (work takes time of its own). True when the thread was off its CPU.
    bool note(Clock::time_point now, bool did_work) {
      const bool gap = !did_work && now - last_ > kPreemptGap;
      last_ = now;
      return gap;
    }

   private:
    Clock::time_point last_;
  };

 private:
  const int64_t max_;
  std::atomic<int64_t> budget_;
  std::atomic<int64_t> next_probe_{0};
  std::atomic<int64_t> probe_every_;
  std::atomic<int> hits_{0};  // hits in a row
};

}  // namespace rdmaflow
