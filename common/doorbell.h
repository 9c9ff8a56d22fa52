// Doorbell: how a rank sleeps until a same-host peer stored something for it
// (the memory channels of transport/shm/memory_channel.h).
//
// Each rank owns one doorbell, 16 bytes of registered memory that every
// same-host peer maps: a 32-bit `bell` (a futex word), a 32-bit count of the
// rank's threads that announced they are about to sleep on it, and a 32-bit
// count of those about to sleep on a file descriptor instead (below). A writer
// publishes its data (release store), then rings: if anybody announced a
// sleep it bumps `bell` and wakes the futex. A waiter announces itself, reads
// `bell`, looks once more at what it waits for, and only then sleeps on `bell`
// (FUTEX_WAIT, shared: the word lives in a shared mapping; with a timeout, so
// a peer that died is noticed). Both sides order their store before their
// load with a full fence, so either the writer sees the announcement or the
// waiter sees the data: no wake-up is lost, and a writer pays no system call
// while nobody sleeps.
//
// Fd sleepers. A thread that must also wait on sockets (a rank with peers on
// other hosts drives their tcp sockets in one ppoll) cannot sleep on a futex.
// It sleeps in ppoll on its sockets plus its rank's wake socket (a unix
// datagram socket, transport/shm/wake_socket.h) and announces itself in the
// third word instead. A ringer that sees that count non-zero sends one byte
// over its `wake_fd` (a datagram socket connected to the owner's wake
// socket). The same fence argument holds: either the ringer sees the
// announcement and sends, or the waiter's last look sees the data. A datagram
// stays queued until the sleeper drains it, so one sent between the
// sleeper's last look and its ppoll makes that ppoll return at once; the
// sleeper drains before it looks again, and the ringer's data was stored
// before its send. A full queue refuses the send (EAGAIN), which is fine: the
// sleeper is readable already. A thread that announced itself as an fd
// sleeper does not send to itself (it delivers tcp notifies on its own
// thread and looks at them next anyway): its own ring skips the send unless
// another thread of the rank sleeps too.
#pragma once

#include <linux/futex.h>
#include <sys/socket.h>
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
  static constexpr size_t kBytes = 16;

  Doorbell() = default;
  // `words`: kBytes, 4-byte aligned, in memory shared with the peers.
  // `wake_fd`: a datagram socket connected to the owner's wake socket, or -1
  // (then fd sleepers are not woken by this ringer: the owner only sleeps on
  // a file descriptor when every peer can wake it).
  explicit Doorbell(std::byte* words, int wake_fd = -1)
      : words_(reinterpret_cast<uint32_t*>(words)), wake_fd_(wake_fd) {}
  bool valid() const { return words_ != nullptr; }

  // Writer side, after the release store that published the data.
  void ring() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters().load(std::memory_order_relaxed) != 0) {
      bell().fetch_add(1, std::memory_order_seq_cst);
      futex(FUTEX_WAKE, INT_MAX, nullptr);
    }
    if (wake_fd_ >= 0) {
      const uint32_t mine = fd_sleeper_ == words_ ? 1 : 0;
      if (fd_waiters().load(std::memory_order_relaxed) > mine) {
        const char byte = 0;
        [[maybe_unused]] ssize_t n = ::send(wake_fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      }
    }
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

  // Fd sleeper side: announce_fd(), then check the condition once more, then
  // ppoll on the wake socket (and anything else) unless it holds, draining
  // the wake socket before every later check; retire_fd() when done. One
  // announcement per thread at a time.
  void announce_fd() const {
    fd_waiters().fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    fd_sleeper_ = words_;
  }
  void retire_fd() const {
    fd_sleeper_ = nullptr;
    fd_waiters().fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  std::atomic_ref<uint32_t> bell() const { return std::atomic_ref<uint32_t>(words_[0]); }
  std::atomic_ref<uint32_t> waiters() const { return std::atomic_ref<uint32_t>(words_[1]); }
  std::atomic_ref<uint32_t> fd_waiters() const { return std::atomic_ref<uint32_t>(words_[2]); }
  void futex(int op, uint32_t val, const timespec* ts) const {
    ::syscall(SYS_futex, words_, op, val, ts, nullptr, 0);
  }

  // The doorbell this thread announced itself on as an fd sleeper.
  static inline thread_local const uint32_t* fd_sleeper_ = nullptr;

  uint32_t* words_ = nullptr;
  int wake_fd_ = -1;
};

}  // namespace rdmaflow
