// Channel: one connection to one peer, the contract every backend keeps
// (see docs/architecture.md, "The channel contract").
//
// Thread model (every backend; docs/architecture.md, "Thread model"):
// operations may be issued from any thread, and issuing never runs a callback.
// Completion callbacks and inbox deliveries run in the backend's progress
// context: its progress thread, or a thread blocked in a wait that drives the
// backend's progress through its WaitDriver (one thread at a time per
// transport). Each callback runs exactly once, even on error, timeout or
// close, and must not block. A channel error is sticky: once the channel
// fails, every pending and every later operation completes with that error
// (naming the peer).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/counters.h"
#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow {

using Millis = std::chrono::milliseconds;
using Callback = std::function<void(const Status&)>;

// Busy polling (optional). A backend whose progress the waiting thread can drive
// itself (the UCX backend, docs/ucx.md) implements WaitDriver and attaches it to
// its channels' inboxes and to the callbacks of the operations it runs. Waits
// then drive it before sleeping on their condition variable, so a completion or
// notification reaches the waiter without a thread hop or a futex wake-up.
// Without a driver, waits sleep on their condition variable right away.
class WaitDriver {
 public:
  virtual ~WaitDriver() = default;
  // Drives progress on the calling thread until `ready()` holds (returns true),
  // `deadline` passes or the backend prefers the waiter to sleep (returns false;
  // the backend's progress thread then takes over). Called with no rdmaflow lock
  // held; `ready` may lock the waited-on object.
  virtual bool drive(const std::function<bool()>& ready,
                     std::chrono::steady_clock::time_point deadline) = 0;
  // One non-blocking round of progress on the calling thread, for pollers
  // (Inbox::poll_notify with nothing queued): a thread that spins on a poll
  // then makes progress itself instead of waiting for the backend's thread.
  virtual void poll() {}
  // Hands back to the backend's progress thread at once whatever poll() left
  // with the calling thread (tcp: the sockets it leased), for a poller about
  // to sleep where only that thread's progress can wake it.
  virtual void release() {}
  // A driver whose drive() waits on the progress of every one of `drivers` at
  // once (this one among them), for a waiter whose condition any of their
  // channels may satisfy (the collectives' executor waiting on several
  // peers): the answer on any channel then wakes the waiter itself. Null when
  // the backend cannot combine them (the default).
  virtual std::shared_ptr<WaitDriver> join(
      const std::vector<std::shared_ptr<WaitDriver>>& /*drivers*/) {
    return nullptr;
  }
  // drive() that also returns to `ready()` when `wake_fd` turns readable (a
  // nonblocking socket or eventfd that other processes write to wake this
  // thread: a same-host doorbell's fd sleepers, common/doorbell.h), after
  // draining it. Only drivers whose watches_fds() is true honour `wake_fd`.
  virtual bool watches_fds() const { return false; }
  virtual bool drive_watching(const std::function<bool()>& ready,
                              std::chrono::steady_clock::time_point deadline, int /*wake_fd*/) {
    return drive(ready, deadline);
  }
};

// Lets waits on `done` drive `driver`, when `done` came from Completion::callback()
// or CompletionGroup::add(); any other callback is left alone.
void attach_wait_driver(const Callback& done, const std::shared_ptr<WaitDriver>& driver);

// Inbound side of a channel: notify values and control messages queued by the
// backend's progress thread, taken by the user with timeouts. Once failed, the
// inbox drains what already arrived and then reports the sticky error.
class Inbox {
 public:
  void push_notify(uint64_t value);
  void push_message(std::vector<uint8_t> bytes);
  void fail(const Status& error);

  // Oldest notify value.
  Result<uint64_t> wait_notify(Millis timeout);
  // A specific notify value (removes one occurrence), for consumers that match
  // notifications by id (transfers, collective tags).
  Status wait_notify_value(uint64_t value, Millis timeout);
  // Oldest notify value if one arrived, without waiting (one round of the wait
  // driver's progress first when none is queued).
  std::optional<uint64_t> poll_notify();
  Result<std::vector<uint8_t>> recv_message(Millis timeout);

  // Called (on the progress thread) after each new notify; must not block.
  void set_notify_listener(std::function<void()> listener);

  void set_peer(int peer) { peer_ = peer; }
  // Where messages received and time spent waiting are counted (Channel::bind_counters).
  void set_counters(stats::PeerCounters* counters) { counters_ = counters; }

  // Waits drive `driver` before sleeping (see WaitDriver).
  void set_wait_driver(std::shared_ptr<WaitDriver> driver);
  // The backend's driver (null when none), for consumers that wait on their own
  // conditions, e.g. the collectives' executor waiting for several peers at once.
  std::shared_ptr<WaitDriver> wait_driver();

 private:
  // Lets the wait driver (if any) run until `ready` holds or `deadline` passes.
  template <typename Pred>
  void drive(std::chrono::steady_clock::time_point deadline, Pred ready);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> notifies_;
  std::deque<std::vector<uint8_t>> messages_;
  std::function<void()> listener_;
  std::shared_ptr<WaitDriver> driver_;
  Status error_;
  int peer_ = -1;
  stats::PeerCounters* counters_ = &stats::unbound();
};

// A same-host peer's registered memory, mapped into this process (see
// Channel::direct_view). Plain loads and stores reach the peer's memory; the
// mapping stays valid while `keep` lives, even after the channel failed or the
// peer revoked the key (stores then land in memory the peer no longer reads).
struct DirectView {
  std::byte* data = nullptr;
  size_t length = 0;
  std::shared_ptr<void> keep;
};

// What a channel can do beyond the contract, for callers that adapt to it
// (the collectives stage sources for a channel that needs registered memory).
struct ChannelCapabilities {
  // write() takes a source anywhere in this process's memory; false: only
  // inside memory registered with the channel's transport.
  bool any_source_memory = false;
};

class Channel {
 public:
  virtual ~Channel() = default;

  virtual int peer_rank() const = 0;
  // The backend's name, for logs and for picking the RemoteKey made for it;
  // behaviour follows capabilities(), never the name.
  virtual std::string backend() const = 0;
  virtual ChannelCapabilities capabilities() const = 0;

  // One-sided write of [src, src + len) into `dst` at `dst_offset`.
  // `src` must lie in memory registered with this channel's transport unless
  // capabilities().any_source_memory. If `notify` is set, the peer's inbox receives
  // it only after every byte of the write is visible in the peer's memory.
  // An offset/length outside the grant completes with kOutOfRange and writes
  // nothing.
  virtual void write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                     std::optional<uint64_t> notify, Callback done, Millis timeout) = 0;

  // write() for a caller that needs no word back from the peer about it (the
  // collectives' pieces and slot credits, whose receiver answers in
  // its own way): `done` may run once the bytes left this process rather
  // than once they are in the peer's memory, and a refusal by the peer (a bad
  // key or range) fails the channel, sticky, instead of only this write. The
  // notify, ordering and source-buffer rules are write()'s. Backends without
  // a cheaper way run write() (the default).
  virtual void post_write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                          std::optional<uint64_t> notify, Callback done, Millis timeout) {
    write(src, len, dst, dst_offset, notify, std::move(done), timeout);
  }

  // post_write() of a write the peer does not need at once (the collectives'
  // slot credits): the backend may hold it back so that it leaves in the same
  // system call as the next frame to the peer, while at most `hold` such
  // writes wait (the one that would be hold + 1 goes at once, the held ones
  // before it). A held write still leaves within a bounded time whatever this
  // process does next (tcp: 1-2 ms, its progress thread's ticks), so a peer
  // waiting for it never depends on this process issuing more. The rules of
  // post_write() hold, its order among this channel's operations too.
  // Backends without a cheaper way post it at once (the default).
  virtual void post_write_deferred(const void* src, size_t len, const RemoteKey& dst,
                                   uint64_t dst_offset, std::optional<uint64_t> notify,
                                   Callback done, Millis timeout, int hold) {
    (void)hold;
    post_write(src, len, dst, dst_offset, notify, std::move(done), timeout);
  }

  // Receive-side landing, for a receiver that would copy a write's bytes out
  // of the memory it granted as soon as they arrive (the collectives' slots):
  // the bytes of this peer's writes that would land at [at, at + len), inside
  // memory this side granted, are put at [dst, dst + len) instead, so the
  // backend's own copy off the wire is the only one. Only writes whose frames
  // arrive after this call move, each frame whole or not at all;
  // take_landing() says which parts did, and the rest is at `at` as usual.
  // The notify of a write is seen only after its bytes are wherever they
  // went. The caller keeps [dst, dst + len) valid and untouched until
  // take_landing(at). False when the backend cannot (the default: nothing
  // moves) or [at, at + len) overlaps a landing already posted.
  virtual bool post_landing(const void* at, size_t len, void* dst) {
    (void)at, (void)len, (void)dst;
    return false;
  }

  // Withdraws the landing posted at `at` and returns which bytes of it went
  // to dst. A frame being received into dst is waited for (a bounded wait: a
  // receive into it never blocks for long); one that was cut short by this
  // call lands nowhere, so withdraw early only when the write no longer
  // matters (a failed call).
  struct Landed {
    static constexpr int kMaxRanges = 8;  // frames beyond these are not moved
    int count = 0;
    struct Range {
      size_t offset = 0;  // from `at`
      size_t len = 0;
    } ranges[kMaxRanges];
  };
  virtual Landed take_landing(const void* at) {
    (void)at;
    return {};
  }

  // One-sided read of `len` bytes of `src` at `src_offset` into `dst`.
  virtual void read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
                    Millis timeout) = 0;

  // [offset, offset + len) of the grant `key` mapped into this process, when
  // the backend reaches the peer's memory by load/store (UCX's direct path to
  // a same-host peer). Never reaches outside the grant: an offset/length
  // beyond it is refused with kOutOfRange. kNotViable when the backend cannot
  // map it (the default). May wait up to `timeout` for the owner to confirm
  // the key (once per key): call it at setup, not per access.
  virtual Result<DirectView> direct_view(const RemoteKey& key, uint64_t offset, size_t len,
                                         Millis timeout);

  // Small ordered control message; delivered to the peer's inbox in order.
  virtual void send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) = 0;

  // Fails every pending operation with kCancelled and closes the connection.
  virtual void close() = 0;

  // OK while healthy; the sticky error once the channel has failed.
  virtual Status error() const = 0;

  Inbox& inbox() { return inbox_; }

  // What this process moved to and from the peer over this channel's backend,
  // shared by every channel to that peer over that backend (common/counters.h).
  stats::PeerCounters& counters() { return *counters_; }

 protected:
  // Backends call it once the peer's rank is known, before the channel is
  // handed out: the data path then counts into a plain pointer.
  void bind_counters(std::string_view backend, int peer) {
    counters_ = &stats::counters(backend, peer);
    inbox_.set_counters(counters_);
  }

  Inbox inbox_;
  stats::PeerCounters* counters_ = &stats::unbound();
};

// Completion: a one-shot waitable that turns a callback-style operation into a
// blocking one.  `Completion c; ch.write(..., c.callback(), t); c.wait(t2);`
class Completion {
 public:
  Completion();
  Callback callback();
  // Waits for the callback; kTimeout if it has not run within `timeout`.
  Status wait(Millis timeout, const std::string& what = "operation");
  bool done() const;

 private:
  friend void attach_wait_driver(const Callback&, const std::shared_ptr<WaitDriver>&);
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    std::shared_ptr<WaitDriver> driver;
  };
  struct Signal {  // the callable behind callback()
    std::shared_ptr<State> s;
    void operator()(const Status& st) const;
  };
  std::shared_ptr<State> state_;
};

// Counts many operations down to zero; the first error wins.
class CompletionGroup {
 public:
  Callback add();
  Status wait(Millis timeout, const std::string& what = "operations");

 private:
  friend void attach_wait_driver(const Callback&, const std::shared_ptr<WaitDriver>&);
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = 0;
    Status first_error;
    std::shared_ptr<WaitDriver> driver;
  };
  struct Signal {  // the callable behind add()
    std::shared_ptr<State> s;
    void operator()(const Status& st) const;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace rdmaflow
