// Doorbell: how a rank sleeps until a same-host peer stored something for it
// (the memory channels of transport/shm/memory_channel.h).
//
// Each rank owns one doorbell, 8 bytes of registered memory that every
// same-host peer maps: a 32-bit `bell` (a futex word) and a 32-bit count of
// the rank's threads that announced they are about to sleep. A writer
// publishes its data (release store), then rings: if anybody announced a
// sleep it bumps `bell` and wakes the futex. A waiter announces itself, reads
// `bell`, looks once more at what it waits for, and only then sleeps on `bell`
// (FUTEX_WAIT, shared: the word lives in a shared mapping; with a timeout, so
// a peer that died is noticed). Both sides order their store before their
// load with a full fence, so either the writer sees the announcement or the
// waiter sees the data: no wake-up is lost, and a writer pays no system call
// while nobody sleeps.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace rdmaflow {

class Doorbell {
 public:
  static constexpr size_t kBytes = 8;

  Doorbell() = default;
  // `words`: 8 bytes, 4-byte aligned, in memory shared with the peers.
  explicit Doorbell(std::byte* words) : words_(reinterpret_cast<uint32_t*>(words)) {}
  bool valid() const { return words_ != nullptr; }

  // Writer side, after the release store that published the data.
  void ring() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters().load(std::memory_order_relaxed) == 0) return;
    bell().fetch_add(1, std::memory_order_seq_cst);
    futex(FUTEX_WAKE, INT_MAX, nullptr);
  }

  // Waiter side: announce(), then check the condition once more, then
  // sleep(ticket) unless it holds, then retire() in any case.
  uint32_t announce() const {
    waiters().fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return bell().load(std::memory_order_seq_cst);
  }
  // Sleeps until the bell moves past `ticket`, a wake-up or `timeout`.
  void sleep(uint32_t ticket, std::chrono::nanoseconds timeout) const {
    if (timeout.count() <= 0) return;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
    futex(FUTEX_WAIT, ticket, &ts);
  }
  void retire() const { waiters().fetch_sub(1, std::memory_order_seq_cst); }

 private:
  std::atomic_ref<uint32_t> bell() const { return std::atomic_ref<uint32_t>(words_[0]); }
  std::atomic_ref<uint32_t> waiters() const { return std::atomic_ref<uint32_t>(words_[1]); }
  void futex(int op, uint32_t val, const timespec* ts) const {
    ::syscall(SYS_futex, words_, op, val, ts, nullptr, 0);
  }

  uint32_t* words_ = nullptr;
};

}  // namespace rdmaflow
