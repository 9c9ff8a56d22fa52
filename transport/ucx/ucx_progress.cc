// UcxCore, the progress engine (thread model: ucx_core.h, docs/ucx.md "Threads"):
// the op pool and completions, submission, progress passes, dispatch of
// user-visible effects, the progress thread and waiters that drive progress,
// notify rings, timeouts, and the watch on peer processes (pidfds in epoll).
#include "transport/ucx/ucx_core.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "transport/shm/notify_ring.h"
#include "transport/ucx/ucx_channel.h"

namespace rdmaflow::ucx {

namespace {

// True while this thread runs user callbacks / inbox deliveries (dispatch).
thread_local bool t_dispatching = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr auto kScanPeriod = std::chrono::milliseconds(1);
constexpr int kMaxSleepMs = 100;

}  // namespace

// ---------------------------------------------------------------------------
// Ops

Op* UcxCore::new_op(OpKind kind, UcxChannel* ch, Callback done, Millis timeout) {
  Op* op = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    op = ops_.acquire();
  }
  op->kind = kind;
  op->ch = ch;
  op->peer = ch != nullptr ? ch->peer_rank() : -1;
  op->done = std::move(done);
  op->refs = 1;  // the user's callback
  op->set_deadline(timeout);
  return op;
}

Op* UcxCore::ctrl_op(UcxChannel* ch) {
  Op* op = new_op(OpKind::kCtrl, ch, nullptr, Millis(0));
  op->completed = true;  // owes nobody a callback: never listed, never swept
  op->refs = 0;
  return op;
}

void UcxCore::release(Op* op) {
  if (--op->refs > 0) return;
  op->put_path = op->notify_stage = op->has_notify = false;
  op->parts = 0;
  op->ch = nullptr;
  op->done = nullptr;
  op->preset = Status();
  op->src = nullptr;
  op->dst = nullptr;
  op->len = op->offset = op->notify = op->seq = 0;
  op->key_id = op->key_addr = op->key_length = 0;
  op->key_secret = {};
  op->blob.clear();
  op->bytes.clear();
  op->hdr = AmHeader{};
  op->qnext = nullptr;
  std::lock_guard<std::mutex> lock(pool_mu_);
  ops_.release(op);
}

void UcxCore::complete(Op* op, Status st) {
  if (!active_.complete(op)) return;
  if (op->done) {
    if (op->ch != nullptr) op->ch->counters().add_result(st);
    Event e;
    e.kind = Event::kCallback;
    e.cb = std::move(op->done);
    e.status = std::move(st);
    events_.push_back(std::move(e));
  }
  release(op);
}

void UcxCore::part_done(Op* op, const Status& st) {
  if (!st.is_ok()) {
    complete(op, st);
    return;
  }
  if (--op->parts <= 0) complete(op, Status::ok());
}

void UcxCore::complete_channel_ops(UcxChannel* ch, const Status& st) {
  active_.for_each([&](Op& op) {
    if (op.ch == ch) complete(&op, st.with_op(op.name()));
  });
}

void UcxCore::emit_notify(Inbox& inbox, uint64_t value) {
  Event e;
  e.kind = Event::kNotify;
  e.inbox = &inbox;
  e.value = value;
  events_.push_back(std::move(e));
}

void UcxCore::emit_message(Inbox& inbox, std::vector<uint8_t> bytes) {
  Event e;
  e.kind = Event::kMessage;
  e.inbox = &inbox;
  e.bytes = std::move(bytes);
  events_.push_back(std::move(e));
}

void UcxCore::emit_inbox_failure(Inbox& inbox, Status st) {
  Event e;
  e.kind = Event::kFail;
  e.inbox = &inbox;
  e.status = std::move(st);
  events_.push_back(std::move(e));
}

void UcxCore::mark_dirty(UcxChannel* ch) {
  if (ch->dirty) return;
  ch->dirty = true;
  dirty_.push_back(ch);
}

void UcxCore::hold_ack(UcxChannel* ch) {
  if (ch->ack_held) return;
  ch->ack_held = true;
  held_acks_.push_back(ch);
  held_count_.store(held_acks_.size(), std::memory_order_relaxed);
}

bool UcxCore::release_acks_locked() {
  if (held_acks_.empty()) return false;
  std::vector<UcxChannel*> held;
  held.swap(held_acks_);
  held_count_.store(0, std::memory_order_relaxed);
  for (UcxChannel* ch : held) {
    ch->ack_held = false;
    ch->flush_acks();
  }
  return true;
}

void UcxCore::scan_timeouts_locked(Clock::time_point now) {
  next_scan_ = now + kScanPeriod;
  active_.sweep(
      now,
      [](const Op& op) -> std::string_view {
        // parts is set when the op is posted and counts down to its completion.
        return op.parts == 0 ? "still queued to send"
                             : "sent, no completion from UCX or reply from the peer yet";
      },
      [&](Op& op, Status timeout) {
        complete(&op, std::move(timeout));
        return true;
      });
}

// ---------------------------------------------------------------------------
// Submission, progress, dispatch

void UcxCore::submit(Op* op) {
  if (stopped()) {
    // No progress context any more: report on this thread.
    Callback cb = std::move(op->done);
    Status st = op->preset.is_ok()
                    ? RDMAFLOW_ERROR(Code::kCancelled, op->name(),
                                     op->ch ? op->ch->peer_rank() : -1, "transport shut down")
                    : op->preset;
    op->completed = true;
    release(op);
    if (cb) cb(st);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    subs_.push_back(op);
    subs_count_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Post right away when nobody else is in progress context (no thread hop).
  bool needs_progress = false;
  bool posted = false;
  while (worker_mu_.try_lock()) {
    posted = true;
    if (!stopped()) {
      request_posted_ = false;
      drain_submissions_locked();
      while (!dirty_.empty()) {
        std::vector<UcxChannel*> dirty;
        dirty.swap(dirty_);
        for (UcxChannel* ch : dirty) {
          ch->dirty = false;
          ch->pump();
          ch->flush_acks();
        }
      }
      // Behind what this submission sent: the answer a held acknowledgement waited for.
      release_acks_locked();
      if (!events_.empty()) {
        needs_progress = true;
        std::lock_guard<std::mutex> lock(ready_mu_);
        for (auto& e : events_) ready_.push_back(std::move(e));
        ready_count_.store(ready_.size(), std::memory_order_release);
        events_.clear();
      }
      needs_progress |= request_posted_;
    }
    worker_mu_.unlock();
    if (subs_count_.load(std::memory_order_seq_cst) == 0) break;
  }
  activity_.fetch_add(1, std::memory_order_seq_cst);
  // Whatever the op still needs (a pending UCP request, callbacks to run) happens in
  // progress context: wake the progress thread for it. An op that went out whole needs
  // nobody until its answer arrives, which wakes a sleeping progress thread by itself
  // (the worker's event fd) - so the common small write costs no syscall here.
  if (needs_progress || !posted) {
    if (busy_waiters_.load(std::memory_order_seq_cst) == 0) {
      // A progress thread backing off (a waiter drove a moment ago) polls again within
      // kScanPeriod and runs what we queued; the issuing thread usually waits next and
      // runs it first. Waking it would cost a syscall and a context switch per op (a
      // ring-notified write completes right here).
      if (!posted || pt_state_.load(std::memory_order_seq_cst) != kPtBackoff) kick();
    } else {
      wake_blocked_waiter();  // it may be the only one driving progress
    }
  }
}

void UcxCore::drain_submissions_locked() {
  if (subs_count_.load(std::memory_order_acquire) == 0) return;
  std::vector<Op*> subs;
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    subs.swap(subs_);
    subs_count_.store(0, std::memory_order_seq_cst);
  }
  for (Op* op : subs) {
    active_.add(op);
    if (!op->preset.is_ok()) {
      complete(op, std::move(op->preset));
      continue;
    }
    op->ch->enqueue(op);
  }
}

bool UcxCore::pass_locked() {
  bool did = false;
  drain_submissions_locked();
  // Held by the previous pass (hold_ack()): whoever it released had its chance to answer.
  if (release_acks_locked()) did = true;
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) did = true;
  if (poll_rings_locked()) did = true;
  if (!hellos_.empty()) {
    handle_hellos_locked();
    did = true;
  }
  for (int round = 0; round < 4 && !dirty_.empty(); ++round) {
    std::vector<UcxChannel*> dirty;
    dirty.swap(dirty_);
    for (UcxChannel* ch : dirty) {
      ch->dirty = false;
      ch->pump();
      ch->flush_acks();
    }
    did = true;
  }
  // Endpoints to close (never closed inside a UCP callback). Always FORCE: a flushing
  // close can wait forever for a dead peer, and ucp_worker_destroy must not find an
  // endpoint with operations still pending.
  if (!to_close_.empty()) {
    const auto now = Clock::now();
    std::vector<ToClose> later;
    auto list = std::move(to_close_);
    to_close_.clear();
    for (auto& c : list) {
      if (c.linger_on != nullptr && c.linger_on->refs > 1 && now < c.deadline &&
          !stop_thread_.load(std::memory_order_acquire)) {
        later.push_back(std::move(c));  // the goodbye is still on its way out
        continue;
      }
      if (c.linger_on != nullptr) release(c.linger_on);
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = ucp_ep_close_nbx(c.ep, &p);
      if (UCS_PTR_IS_PTR(req)) {
        closing_.push_back(Closing{req, std::move(c.rkeys)});
      } else {
        for (ucp_rkey_h k : c.rkeys) ucp_rkey_destroy(k);
      }
    }
    for (auto& c : later) to_close_.push_back(std::move(c));
    did = true;
  }
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i].request) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i].request);
      for (ucp_rkey_h k : closing_[i].rkeys) ucp_rkey_destroy(k);
      closing_[i] = std::move(closing_.back());
      closing_.pop_back();
    } else {
      ++i;
    }
  }
  const auto now = active_.empty() ? Clock::time_point{} : Clock::now();
  if (!active_.empty() && now >= next_scan_) scan_timeouts_locked(now);
  if (!events_.empty()) {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (ready_.empty()) {
      ready_.swap(events_);
    } else {
      for (auto& e : events_) ready_.push_back(std::move(e));
      events_.clear();
    }
    ready_count_.store(ready_.size(), std::memory_order_release);
    did = true;
  }
  return did;
}

bool UcxCore::poll_rings_locked() {
  bool did = false;
  for (size_t i = 0; i < ring_channels_.size();) {
    UcxChannel* ch = ring_channels_[i];
    if (ch->rx_ring() == nullptr) {  // failed
      ring_channels_[i] = ring_channels_.back();
      ring_channels_.pop_back();
      continue;
    }
    if (ch->poll_ring()) did = true;
    ++i;
  }
  return did;
}

bool UcxCore::arm_rings_locked(std::vector<std::shared_ptr<shm::NotifyRing>>& armed) {
  for (UcxChannel* ch : ring_channels_) {
    if (ch->rx_ring() == nullptr) continue;
    ch->rx_ring()->header()->sleepers.fetch_add(1, std::memory_order_seq_cst);
    armed.push_back(ch->rx_ring());
  }
  // The producer stores its tail, fences, then loads sleepers: after our increment,
  // either we see its entry here or it sees us and sends a wake-up message.
  for (UcxChannel* ch : ring_channels_) {
    if (ch->ring_deliverable()) {
      disarm_rings(armed);
      return false;
    }
  }
  return true;
}

void UcxCore::disarm_rings(std::vector<std::shared_ptr<shm::NotifyRing>>& armed) {
  for (auto& r : armed) r->header()->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  armed.clear();
}

bool UcxCore::progress_once(bool* did) {
  bool locked = false;
  bool any = false;
  while (worker_mu_.try_lock()) {
    locked = true;
    if (!stopped()) any |= pass_locked();
    worker_mu_.unlock();
    if (subs_count_.load(std::memory_order_seq_cst) == 0) break;
  }
  if (did != nullptr) *did = any;
  return locked;
}

void UcxCore::dispatch() {
  if (t_dispatching) return;  // a callback is waiting; events stay queued in order
  while (ready_count_.load(std::memory_order_acquire) > 0) {
    if (!dispatch_mu_.try_lock()) return;  // the dispatching thread re-checks after unlocking
    t_dispatching = true;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(ready_mu_);
        if (ready_.empty()) break;
        dispatching_.swap(ready_);
        ready_count_.store(0, std::memory_order_release);
      }
      for (Event& e : dispatching_) {
        try {
          switch (e.kind) {
            case Event::kCallback:
              e.cb(e.status);
              break;
            case Event::kNotify:
              e.inbox->push_notify(e.value);
              break;
            case Event::kMessage:
              e.inbox->push_message(std::move(e.bytes));
              break;
            case Event::kFail:
              e.inbox->fail(e.status);
              break;
          }
        } catch (const std::exception& ex) {
          RDMAFLOW_LOG_ERROR("ucx: a completion callback threw: {}", ex.what());
        } catch (...) {
          RDMAFLOW_LOG_ERROR("ucx: a completion callback threw");
        }
      }
      dispatching_.clear();
      // What was delivered may be what a waiter asleep in drive_blocking waits for.
      wake_blocked_waiter();
    }
    t_dispatching = false;
    dispatch_mu_.unlock();
  }
}

void UcxCore::wake_blocked_waiter() {
  // Pairs with the sleeper's store of blocking_sleeping_ before it checks for work:
  // either it sees what we queued, or we see it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!blocking_sleeping_.load(std::memory_order_seq_cst)) return;
  uint64_t one = 1;
  ssize_t n = ::write(waiter_fd_, &one, sizeof(one));
  (void)n;
}

void UcxCore::drain_ring_wakes() {
  // One read resets the eventfd's counter (no EFD_SEMAPHORE).
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(ring_wake_fd_, &v, sizeof(v));
}

void UcxCore::kick() {
  if (pt_state_.load(std::memory_order_seq_cst) == kPtRunning) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  (void)n;
}

bool UcxCore::poll_control(int timeout_ms) {
  epoll_event evs[16];
  const int n = ::epoll_wait(control_ep_, evs, 16, timeout_ms);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.u64 == kWakeTag) {
      uint64_t v;
      while (::read(wake_fd_, &v, sizeof(v)) == sizeof(v)) {
      }
    } else {
      on_peer_exit(static_cast<uint32_t>(evs[i].data.u64));
    }
    any = true;
  }
  return any;
}

void UcxCore::progress_thread() {
  auto last_activity = Clock::now();
  auto next_control = last_activity;
  while (!stop_thread_.load(std::memory_order_acquire)) {
    if (busy_waiters_.load(std::memory_order_seq_cst) > 0) {
      // A waiting thread drives progress itself; stay off its core, but keep
      // watching peer processes and deadlines.
      pt_state_.store(kPtBackoff, std::memory_order_seq_cst);
      if (busy_waiters_.load(std::memory_order_seq_cst) > 0) poll_control(1);
      pt_state_.store(kPtRunning, std::memory_order_seq_cst);
      if (busy_waiters_.load(std::memory_order_seq_cst) == 0) {
        // The waiters left: do the housekeeping they may have skipped.
        std::lock_guard<std::mutex> lock(worker_mu_);
        if (!active_.empty()) scan_timeouts_locked(Clock::now());
      }
      last_activity = Clock::now();
      continue;
    }
    bool did = false;
    progress_once(&did);
    dispatch();
    const auto now = Clock::now();
    if (now >= next_control) {
      poll_control(0);
      next_control = now + kScanPeriod;
    }
    if (did) {
      last_activity = now;
      continue;
    }
    if (now - last_activity < options_.progress_spin) {
      cpu_relax();
      continue;
    }
    // Nothing to do for a while: arm the worker's event fd and sleep.
    const uint64_t seen = activity_.load(std::memory_order_seq_cst);
    int timeout_ms = kMaxSleepMs;
    {
      std::unique_lock<std::mutex> lock(worker_mu_);
      if (pass_locked()) {
        lock.unlock();
        dispatch();
        continue;
      }
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      if (!arm_rings_locked(pt_armed_)) continue;
      if (!active_.empty()) {
        const Clock::time_point earliest = active_.earliest_deadline();
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 1, kMaxSleepMs));
      }
      if (!closing_.empty() || !to_close_.empty()) timeout_ms = 1;
      pt_state_.store(kPtSleeping, std::memory_order_seq_cst);
    }
    if (activity_.load(std::memory_order_seq_cst) == seen &&
        subs_count_.load(std::memory_order_seq_cst) == 0 &&
        ready_count_.load(std::memory_order_seq_cst) == 0 &&
        busy_waiters_.load(std::memory_order_seq_cst) == 0) {
      epoll_event evs[4];
      ::epoll_wait(sleep_ep_, evs, 4, timeout_ms);
    }
    disarm_rings(pt_armed_);
    // A waiter that started driving meanwhile may sleep on the same eventfd: leave
    // the wake-up to it (drained here, its epoll_wait would not return), since this
    // thread now backs off without a pass.
    if (busy_waiters_.load(std::memory_order_seq_cst) == 0) drain_ring_wakes();
    pt_state_.store(kPtRunning, std::memory_order_seq_cst);
    poll_control(0);
    next_control = Clock::now() + kScanPeriod;
    last_activity = Clock::now();
  }
  pt_state_.store(kPtStopped, std::memory_order_seq_cst);
}

bool UcxCore::drive(const std::function<bool()>& ready, Clock::time_point deadline) {
  if (stopped() ||
      (!options_.busy_poll && options_.wait_spin.count() == 0 && !options_.wait_block)) {
    return false;
  }
  // How long to spin: to the deadline with busy polling, else what spinning
  // achieved lately (common/spin_policy.h): the full budget while answers land
  // during the spin, nothing while the CPUs are contended.
  const auto start = Clock::now();
  bool probe = false;
  const Clock::duration budget =
      options_.busy_poll ? deadline - start : spin_policy_.budget(start, &probe);
  const auto spin_end = std::min(deadline, start + budget);
  busy_waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool ok = false;
  bool spun = false;  // polled at least once before ready() held
  auto outcome = SpinPolicy::Outcome::kMiss;
  SpinPolicy::Watch watch(start);
  for (uint32_t i = 0;; ++i) {
    if (ready()) {
      ok = true;
      if (outcome != SpinPolicy::Outcome::kPreempted) outcome = SpinPolicy::Outcome::kHit;
      break;
    }
    // Off its CPU a moment ago: whatever arrives now waits for this thread to be
    // scheduled again. Sleep instead, the kernel runs a woken sleeper promptly.
    if (outcome == SpinPolicy::Outcome::kPreempted) break;
    if (stopped() || budget <= Clock::duration::zero()) break;
    spun = true;
    bool did = false;
    if (!progress_once(&did)) cpu_relax();
    dispatch();
    const auto now = Clock::now();
    if (watch.note(now, did) && !options_.busy_poll) {
      outcome = SpinPolicy::Outcome::kPreempted;
      continue;  // one more look at ready()
    }
    if (now >= spin_end) break;
    // On a busy machine the peer we wait for may be runnable on this core: let it
    // run now (a no-op when nobody else is runnable). A yield that kept the core
    // away for long gave it to other work: that is a preemption too.
    if (options_.spin_yield > 0 && i % options_.spin_yield == options_.spin_yield - 1) {
      std::this_thread::yield();
      if (watch.note(Clock::now(), false) && !options_.busy_poll) {
        outcome = SpinPolicy::Outcome::kPreempted;
      }
    }
  }
  if (spun && !options_.busy_poll) spin_policy_.record(budget, probe, outcome, Clock::now());
  if (!ok && options_.wait_block && !options_.busy_poll && !t_dispatching &&
      Clock::now() < deadline) {
    ok = drive_blocking(ready, deadline);
  }
  const bool last = busy_waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1;
  if (!ok) followers_.fetch_add(1, std::memory_order_seq_cst);
  if (last && followers_.exchange(0, std::memory_order_seq_cst) > 0) {
    // A waiter sleeps on its condition variable and nobody drives: hand progress back.
    activity_.fetch_add(1, std::memory_order_seq_cst);
    kick();
  } else if (last && held_count_.load(std::memory_order_relaxed) > 0 &&
             pt_state_.load(std::memory_order_seq_cst) == kPtSleeping) {
    // An acknowledgement this wait held must not wait for the thread's next timeout
    // if this thread sends nothing soon (a backing-off thread looks within kScanPeriod).
    activity_.fetch_add(1, std::memory_order_seq_cst);
    kick();
  }
  return ok;
}

void UcxCore::poll() {
  if (stopped()) return;
  progress_once(nullptr);
  dispatch();
}

bool UcxCore::drive_blocking(const std::function<bool()>& ready, Clock::time_point deadline) {
  if (blocking_taken_.exchange(true, std::memory_order_seq_cst)) return false;
  bool ok = false;
  for (;;) {
    if (ready()) {
      ok = true;
      break;
    }
    const auto now = Clock::now();
    if (stopped() || stop_thread_.load(std::memory_order_acquire) || now >= deadline) break;
    // One pass; if it found nothing to do, arm the worker's event fd and sleep on it.
    bool did = false;
    int timeout_ms = 0;
    {
      std::lock_guard<std::mutex> lock(worker_mu_);
      if (stopped()) break;
      did = pass_locked();
      if (!did && ucp_worker_arm(worker_) == UCS_ERR_BUSY) did = true;
      if (!did && !arm_rings_locked(waiter_armed_)) did = true;
      if (!did) {
        Clock::time_point wake = std::min(deadline, now + std::chrono::milliseconds(kMaxSleepMs));
        wake = std::min(wake, active_.earliest_deadline());
        if (!closing_.empty() || !to_close_.empty()) wake = now + std::chrono::milliseconds(1);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 1, kMaxSleepMs));
      }
    }
    dispatch();
    if (did) continue;
    blocking_sleeping_.store(true, std::memory_order_seq_cst);
    // Anything queued or delivered after the pass wakes us through waiter_fd_.
    epoll_event evs[4];
    int n = 0;
    if (subs_count_.load(std::memory_order_seq_cst) == 0 &&
        ready_count_.load(std::memory_order_seq_cst) == 0 && !ready()) {
      n = ::epoll_wait(waiter_ep_, evs, 4, timeout_ms);
    }
    disarm_rings(waiter_armed_);
    blocking_sleeping_.store(false, std::memory_order_seq_cst);
    // Reset only what woke us: each look is a system call on the wake-up path
    // (an eventfd written after this stays readable and ends the next sleep).
    for (int i = 0; i < n; ++i) {
      switch (evs[i].data.u64) {
        case kControlTag:
          poll_control(0);  // peer exits, the shutdown wake-up
          break;
        case kWaiterTag: {
          uint64_t v;
          while (::read(waiter_fd_, &v, sizeof(v)) == sizeof(v)) {
          }
          break;
        }
        case kRingWakeTag:
          drain_ring_wakes();
          break;
        default:
          break;  // the worker: the next pass progresses it
      }
    }
  }
  blocking_taken_.store(false, std::memory_order_seq_cst);
  return ok;
}

// ---------------------------------------------------------------------------
// Control-plane waits (connect, accept, revoke)

bool UcxCore::wait_control(const std::function<bool()>& pred, Clock::time_point deadline) {
  auto check = [&] {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    return pred() || stopped();
  };
  if (t_dispatching || std::this_thread::get_id() == thread_.get_id() ||
      stop_thread_.load(std::memory_order_acquire)) {
    // Called from a callback, or nobody else drives progress: drive it here.
    while (!check() && Clock::now() < deadline) {
      if (!progress_once(nullptr)) cpu_relax();
    }
    return check();
  }
  kick();
  std::unique_lock<std::mutex> lock(ctl_mu_);
  return ctl_cv_.wait_until(lock, deadline, [&] { return pred() || stopped(); });
}

void UcxCore::notify_control() {
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

// ---------------------------------------------------------------------------
// Peers: pidfds and endpoints to close

void UcxCore::watch_pidfd(int fd, uint32_t channel) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = channel;
  if (::epoll_ctl(control_ep_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    RDMAFLOW_LOG_WARN("ucx: cannot watch peer pidfd: {}", std::strerror(errno));
  }
}

void UcxCore::unwatch_pidfd(int fd) {
  ::epoll_ctl(control_ep_, EPOLL_CTL_DEL, fd, nullptr);
}

void UcxCore::on_peer_exit(uint32_t channel) {
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped() || channel == 0 || channel > channels_.size()) return;
    channels_[channel - 1]->peer_exited();
    pass_locked();
  }
  dispatch();
}

void UcxCore::retire_ep(ucp_ep_h ep, std::vector<ucp_rkey_h> rkeys, Op* linger_on) {
  to_close_.push_back(
      ToClose{ep, std::move(rkeys), linger_on, Clock::now() + std::chrono::milliseconds(200)});
}

}  // namespace rdmaflow::ucx
