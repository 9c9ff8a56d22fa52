// The notify ring of a direct channel (docs/ucx.md, "Notify ring").
//
// On a direct channel a write is a memcpy into the peer's shared pages; only its
// notify needs to travel. Instead of an active message (about 1.3 us each way
// plus an acknowledgement), the writer publishes the notify in a single-producer,
// single-consumer ring in shared memory that the receiver owns (one memfd per
// channel, fetched by the writer with pidfd_getfd like the registered slabs):
//
//   producer (writer)                     consumer (receiver, progress context)
//   memcpy payload into the peer's pages  t = tail.load(acquire)
//   slot[tail % n] = {seq, key, ...}      for each slot in [head, t): check, deliver
//   tail.store(tail + 1, release)         head.store(..., release)
//   fence; if sleepers: wake it           before sleeping: sleepers++, fence, recheck
//
// The wake-up is a write to the receiver's eventfd (fetched with the ring), on
// which its sleeping threads wait: the kernel wakes the sleeper directly, one
// system call, no message.
//
// Every ring entry carries the channel's sequence number, shared with the ordered
// active messages (messages, am-path writes, notifies, goodbye), so the receiver
// applies both sources in one order. The consumer treats everything it reads from
// the ring as untrusted: indices are computed from its own counters, the tail is
// bounds-checked, every entry's key, secret and range are checked against the
// grant table, and a bad entry fails the channel (sticky, naming the peer).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow::shm {

// One published notify: what the receiver needs to check the grant and deliver it.
struct RingSlot {
  uint64_t seq = 0;  // the channel's ordered sequence number
  uint64_t key_id = 0;
  KeySecret secret;
  uint64_t offset = 0;  // of the write, inside the grant
  uint64_t length = 0;
  uint64_t notify = 0;
  uint64_t reserved = 0;
};
static_assert(sizeof(RingSlot) == 64, "one cache line per slot");

struct RingHeader {
  static constexpr uint64_t kMagic = 0x72666e6f74696679ull;  // "rfnotify"
  alignas(64) uint64_t magic = kMagic;
  uint64_t slots = 0;
  alignas(64) std::atomic<uint64_t> tail{0};  // written by the producer
  alignas(64) std::atomic<uint64_t> head{0};  // written by the consumer
  // Consumer threads about to sleep (or asleep) on the receiver's event fd: a
  // producer that sees it nonzero after publishing wakes them (NotifyRing::wake).
  alignas(64) std::atomic<uint32_t> sleepers{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "ring counters are shared between processes");
static_assert(sizeof(RingHeader) == 256, "four cache lines");

// The consumer's checks on what the producer wrote (pure: the consumer, ucx_recv.cc,
// and the fuzz target, fuzz/fuzz_notify_ring.cc, run the same code).
//
// The entries published after `head`, or nullopt when `tail` is not within
// `slots` after it (a producer that is broken or hostile).
inline std::optional<uint64_t> ring_published(uint64_t tail, uint64_t head, uint32_t slots) {
  const uint64_t n = tail - head;
  if (n > slots) return std::nullopt;
  return n;
}

// A ring entry may run ahead of the receiver's sequence by the ordered messages
// still on their way; anything further is not a number this peer could have sent.
constexpr uint64_t kMaxSeqAhead = uint64_t{1} << 32;

enum class EntryOrder : uint8_t {
  kNext,   // the consumer's next sequence number: deliver it
  kLater,  // an ordered message before it is still on its way: wait for it
  kBad,    // behind, too far ahead, or a number already taken by a held message
};
// Entry sequence number `seq` against the consumer's `next`; `held` says whether
// a message with that number already waits.
inline EntryOrder entry_order(uint64_t seq, uint64_t next, bool held) {
  if (seq == next) return EntryOrder::kNext;
  if (seq < next || seq - next > kMaxSeqAhead || held) return EntryOrder::kBad;
  return EntryOrder::kLater;
}

// A mapping of one ring (the owner's, or a peer's fetched with pidfd_getfd).
class NotifyRing {
 public:
  static constexpr uint32_t kMaxSlots = 1u << 20;
  static size_t bytes(uint32_t slots) { return sizeof(RingHeader) + size_t{slots} * 64; }

  // The receiver's side: a new memfd-backed ring of `slots` entries.
  static Result<std::shared_ptr<NotifyRing>> create(uint32_t slots);
  // The writer's side: maps descriptor `remote_fd` of the process of `pidfd`, after
  // checking its size and header against `slots` (from the owner's key reply), and
  // fetches the owner's wake-up eventfd `remote_wake_fd` (-1, or a descriptor that
  // is no eventfd: none; then wake() returns false and the writer wakes the owner
  // some other way).
  static Result<std::shared_ptr<NotifyRing>> map_peer(int pidfd, int remote_fd, uint32_t slots,
                                                      int remote_wake_fd = -1);
  ~NotifyRing();
  NotifyRing(const NotifyRing&) = delete;
  NotifyRing& operator=(const NotifyRing&) = delete;

  int fd() const { return fd_; }  // -1 on the writer's side
  // Writer's side: wakes the owner's sleeping consumers; false without an eventfd.
  bool wake() const;
  uint32_t slots() const { return slots_; }
  RingHeader* header() const { return header_; }
  // Index from the caller's own counter, never from shared memory.
  RingSlot* slot(uint64_t position) const { return slot0_ + position % slots_; }
  uint8_t* base() const { return reinterpret_cast<uint8_t*>(header_); }
  size_t length() const { return len_; }

 private:
  NotifyRing(RingHeader* header, size_t len, uint32_t slots, int fd, int wake_fd = -1);
  RingHeader* header_;
  RingSlot* slot0_;
  size_t len_;
  uint32_t slots_;
  int fd_;
  int wake_fd_;  // the writer's copy of the owner's eventfd
};

}  // namespace rdmaflow::shm
