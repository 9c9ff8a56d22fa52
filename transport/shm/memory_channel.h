// MemoryChannel: a same-host peer's memory as a channel of its own, beside the
// Channel that carries messages to it (MSCCL++'s MemoryChannel beside its
// PortChannel: the same put / signal / wait vocabulary over load and store).
//
//   sender (this rank)                          receiver (the peer)
//   put(offset, src, len)    memcpy into the    ...
//                            peer's mapping
//   signal(word, value)      release store of   wait: acquire loads of the word
//                            the word, then     (poll), then sleep on its own
//                            ring its Doorbell  Doorbell until the deadline
//
// A MemoryChannel is the peer's granted memory mapped into this process
// (PeerMemory, through Channel::direct_view) plus the peer's Doorbell
// (common/doorbell.h), mapped the same way. No message, no progress thread, no
// acknowledgement: put and signal are complete when they return. Every access
// is bounds-checked against the grant (an out-of-range put or signal is
// refused with kOutOfRange and writes nothing).
//
// MemoryEndpoint is this rank's end: the doorbell its peers ring, and the waits
// on the words they signal into its memory. Its connect_all establishes the
// channels over a set of peer Channels, two ordered messages each way:
//
//   1. offer: this rank's doorbell key, exported through the peer's transport,
//      and the address of its wake socket (both empty when this rank does not
//      offer a memory channel);
//   2. each side maps what it can (the peer's grant and doorbell, through
//      Channel::direct_view; UCX to a same-host peer can, tcp, verbs and UCX
//      between hosts cannot), connects to the peer's wake socket
//      (wake_socket.h), and says whether it did each.
//
// A pair uses its memory channel only when both sides mapped the other's
// memory; otherwise both keep their Channel for that peer, so one side that
// cannot map never leaves the other storing into memory nobody reads. A rank
// sleeps on its wake socket (MemoryEndpoint::wake_fd) only when every peer it
// has a memory channel with connected to that socket. The
// mappings of a connected pair are prefaulted (both the peer's memory mapped
// here and this rank's memory the peer stores into), so the first accesses pay
// no page faults.
//
// A dead peer's memory stays mapped, and stores into it still "succeed": the
// caller learns of the peer's death from its Channel (UCX watches same-host
// peers with a pidfd, peer_process.h) and checks it while it waits.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/doorbell.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/shm/peer_memory.h"
#include "transport/shm/wake_socket.h"
#include "transport/transport.h"

namespace rdmaflow::shm {

class MemoryChannel {
 public:
  MemoryChannel() = default;  // not connected: the pair keeps its Channel
  // `wake`: connected to the peer's wake socket, or none (then the peer's fd
  // sleepers are not woken from here, and the peer does not sleep on one).
  MemoryChannel(PeerMemory memory, PeerMemory bell_memory, OwnedFd wake)
      : memory_(std::move(memory)),
        bell_memory_(std::move(bell_memory)),
        wake_(std::move(wake)),
        bell_(bell_memory_.data(), wake_.get()) {}

  bool connected() const { return memory_.mapped(); }
  int peer_rank() const { return memory_.peer_rank(); }
  // The peer's granted memory, mapped here.
  const PeerMemory& memory() const { return memory_; }

  // Copies [src, src + len) to `remote_offset` of the peer's grant. The peer
  // may read it once a later signal() reached it.
  Status put(uint64_t remote_offset, const void* src, size_t len) const {
    return memory_.put(remote_offset, src, len);
  }
  // Publishes everything this thread put before: a release store of `value`
  // into the 8-byte word at `remote_word_offset` of the peer's grant, then a
  // ring of the peer's doorbell (a system call only when the peer sleeps).
  Status signal(uint64_t remote_word_offset, uint64_t value) const {
    RDMAFLOW_RETURN_IF_ERROR(memory_.store_release(remote_word_offset, value));
    bell_.ring();
    return Status::ok();
  }

 private:
  PeerMemory memory_;
  PeerMemory bell_memory_;  // keeps the peer's doorbell mapped
  OwnedFd wake_;            // to the peer's wake socket (its fd sleepers)
  Doorbell bell_;
};

// Acquire load of an 8-byte word of this process's memory that a peer
// signals into: pairs with MemoryChannel::signal's release store, so whoever
// sees the value also sees what the peer put before it.
inline uint64_t load_word(const std::byte* word) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<std::byte*>(word)))
      .load(std::memory_order_acquire);
}

// One peer of MemoryEndpoint::connect_all.
struct MemoryPeer {
  Channel* channel = nullptr;      // null: nobody at this rank (this rank itself)
  Transport* transport = nullptr;  // exports this rank's doorbell to the peer
  RemoteKey remote;                // the peer's grant this rank puts and signals into
  std::span<std::byte> local;      // this rank's memory the peer puts and signals into
};

// How a waiter polls the words its peers signal and when it sleeps.
struct PollOptions {
  std::chrono::microseconds spin{10000};  // poll this long without progress before sleeping
  int yield_every = 0;                    // sched_yield() every N idle polls; 0: never
  std::chrono::nanoseconds recheck = std::chrono::milliseconds(20);  // longest single sleep
};

class MemoryEndpoint {
 public:
  using Clock = std::chrono::steady_clock;

  // `doorbell`: Doorbell::kBytes, 8-byte aligned, inside memory registered with
  // the transport of every peer connect_all is given (it exports the range).
  explicit MemoryEndpoint(std::byte* doorbell) : bell_bytes_(doorbell), bell_(doorbell) {}
  ~MemoryEndpoint();  // revoke_keys()
  MemoryEndpoint(const MemoryEndpoint&) = delete;
  MemoryEndpoint& operator=(const MemoryEndpoint&) = delete;

  // Establishes a memory channel to every peer where both sides can (see the
  // top of this file); indexed like `peers`, not connected where the pair keeps
  // its Channel. Every peer must call it with this rank among its peers, in the
  // same place of the ordered message stream. `offer` false: this rank takes
  // no memory channel (its peers learn so and keep their Channels too).
  // Fails only when a channel fails, a peer answers out of protocol or a
  // mapping fails for a reason other than kNotViable.
  Result<std::vector<MemoryChannel>> connect_all(const std::vector<MemoryPeer>& peers, bool offer,
                                                 Millis timeout);

  // Revokes the doorbell keys connect_all exported; idempotent. Call before
  // the doorbell's memory is deregistered (which is what ends a peer's
  // mapping's reach into it: UCX turns the pages private again).
  void revoke_keys();

  // The doorbell peers ring after each signal, as this rank's waiters see it.
  const Doorbell& doorbell() const { return bell_; }
  // The same for a local event that a waiter must see (Signal::set_doorbell):
  // it also wakes this rank's fd sleepers, through a socket `keep` holds open.
  Doorbell local_ringer(std::shared_ptr<const void>& keep) const {
    keep = self_;
    return Doorbell(bell_bytes_, self_ ? self_->get() : -1);
  }
  // The wake socket this rank's fd sleepers ppoll (Doorbell::announce_fd),
  // or -1 when some peer with a memory channel cannot reach it: then only
  // the futex wakes this rank.
  int wake_fd() const { return wake_reached_ ? wake_.fd() : -1; }
  // Times a waiter slept on the doorbell.
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

  // Runs `step()` (one pass over what the caller waits for, typically
  // load_word of the words peers signal; true when it made progress) until
  // `done()`. After `options.spin` without progress it asks `idle(now)`
  // (true: stop, e.g. the deadline passed or a peer failed), then sleeps on
  // the doorbell for at most `options.recheck` (never past `deadline`) unless
  // one more step() after announcing the sleep made progress: a peer that
  // signals meanwhile either sees the sleeper and rings, or the step sees its
  // store. The clock is read every 16 idle polls only (it is most of a poll).
  template <typename Step, typename Done, typename Idle>
  void poll(Step&& step, Done&& done, Idle&& idle, Clock::time_point deadline,
            const PollOptions& options) const {
    poll(step, step, done, idle, deadline, options);
  }

  // The same, with `look()` (like step()) for the one pass between announcing
  // the sleep and sleeping, where step() would take back what idle() just
  // handed over (the executor's mixed poll: tcp sockets read by the poller).
  template <typename Step, typename Look, typename Done, typename Idle>
  void poll(Step&& step, Look&& look, Done&& done, Idle&& idle, Clock::time_point deadline,
            const PollOptions& options) const {
    int polls = 0;
    bool moved = true;  // progress since the clock was last read (the start counts)
    Clock::time_point spin_until{};
    while (!done()) {
      if (step()) {
        moved = true;
        polls = 0;
        continue;
      }
      if ((++polls & 15) != 0 && options.spin.count() > 0) {
        if (options.yield_every > 0 && polls % options.yield_every == 0) sched_yield();
        continue;
      }
      const auto now = Clock::now();
      if (moved) {
        moved = false;
        spin_until = std::min(deadline, now + options.spin);  // never past the deadline
      }
      if (now < spin_until) {
        if (options.yield_every > 0) sched_yield();
        continue;
      }
      if (idle(now)) return;
      const uint32_t ticket = bell_.announce();
      if (look()) {
        bell_.retire();
        moved = true;
        continue;
      }
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      bell_.sleep(ticket, std::min<Clock::duration>(deadline - now, options.recheck));
      bell_.retire();
    }
  }

  // Waits until `ready()` holds (true) or `deadline` passes (false).
  template <typename Ready>
  bool wait(Ready&& ready, Clock::time_point deadline, const PollOptions& options = {}) const {
    bool hit = false;
    poll([&] { return hit = ready(); }, [&] { return hit; },
         [&](Clock::time_point now) { return now >= deadline; }, deadline, options);
    return hit;
  }

 private:
  std::byte* const bell_bytes_;
  const Doorbell bell_;
  WakeSocket wake_;
  bool wake_reached_ = false;            // by every peer with a memory channel
  std::shared_ptr<const OwnedFd> self_;  // connected to wake_, for local rings
  mutable std::atomic<uint64_t> sleeps_{0};
  std::vector<std::pair<Transport*, RemoteKey>> exported_;  // doorbell keys, per peer
};

}  // namespace rdmaflow::shm
