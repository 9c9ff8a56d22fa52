// Signal: "something happened" for the thread running a collective. Notify
// listeners and write callbacks (on transport progress threads) bump an epoch;
// the waiter spins briefly (yielding, so oversubscribed ranks still make
// progress) and then sleeps on a condition variable. The notifier only takes
// the lock when somebody sleeps, so the spinning fast path is lock-free. With
// same-host direct peers the executor sleeps on its memory endpoint's doorbell
// instead (transport/shm/memory_channel.h), which notify() rings as well.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "common/doorbell.h"

namespace rdmaflow {

class Signal {
 public:
  using Clock = std::chrono::steady_clock;

  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }

  // Also ring `bell` on every notify: a waiter sleeping on that doorbell
  // (the fabric's direct path) wakes for local events too. Set before use.
  void set_doorbell(Doorbell bell) { bell_ = bell; }

  void notify() {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (bell_.valid()) bell_.ring();
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }

  // Returns true when the epoch moved past `seen`, false at `deadline`.
  bool wait(uint64_t seen, Clock::time_point deadline, std::chrono::microseconds spin) {
    if (epoch() != seen) return true;
    if (spin.count() > 0) {
      // A spin never outlasts the deadline.
      const auto spin_until = std::min(deadline, Clock::now() + spin);
      int i = 0;
      while (epoch() == seen) {
        if ((++i & 63) == 0) {
          if (Clock::now() >= spin_until) break;
          sched_yield();
        }
      }
      if (epoch() != seen) return true;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    bool moved;
    {
      std::unique_lock<std::mutex> lock(mu_);
      moved = cv_.wait_until(lock, deadline, [&] { return epoch() != seen; });
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return moved;
  }

 private:
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  Doorbell bell_;
};

}  // namespace rdmaflow
