// Operations as every backend keeps them, from issue to their one completion
// (the channel contract: every operation completes exactly once, with a status
// that names the operation, the peer and the reason; every wait has a timeout).
//
//   OpRecord      what the shared pieces know of one operation: its id, peer,
//                 timeout and deadline, and whether its completion was reported.
//                 A backend's op type derives from it and adds its own state.
//   OpTable<Op>   pooled ops with generation-checked ids: no allocation per
//                 operation once warm, and a late reply carrying the id of an op
//                 whose slot was recycled finds nothing.
//   OpLedger<Op>  the ops still owed a completion, oldest first: exactly-once
//                 completion, the deadline sweep, and failing all of them at
//                 once when the channel fails.
//   deadline_after, timeout_status: one deadline rule, one timeout wording.
//
// None of these takes a lock: each backend already serializes its op state
// under a lock of its own (tcp: the channel's mu_; ucx: pool_mu_ for the table,
// the worker lock for the ledger; verbs: the channel's mu_), and every call is
// made with that lock held. Completion callbacks are not run here either: the
// backend collects them and runs them where its thread model says
// (docs/architecture.md, "Thread model").
//
// An Op type used with these templates derives from OpRecord and has
// `const char* name() const` ("write", "read", "send message", ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rdmaflow {

using OpClock = std::chrono::steady_clock;

// `timeout` from `now`, clamped to [0, one year]: a negative timeout is due at
// once, and a huge one (Millis::max() meaning "forever") must not overflow.
OpClock::time_point deadline_after(std::chrono::milliseconds timeout,
                                   OpClock::time_point now = OpClock::now());

// The status of an operation whose deadline passed:
//   "<op> (peer rank N) failed: timeout: not completed within X ms (<state>)"
// `state` says, in the backend's words, where the operation stood (e.g. "still
// queued to send"); empty: no parenthesis.
Status timeout_status(std::string op, int peer, std::chrono::milliseconds timeout,
                      std::string_view state, SourceLocation where = SourceLocation::current());

class OpRecord {
 public:
  uint64_t id = 0;  // OpTable: (generation << 32) | slot
  int peer = -1;    // the peer rank its statuses name
  std::chrono::milliseconds timeout{0};
  OpClock::time_point deadline = OpClock::time_point::max();  // max: none (never swept)
  // Its completion was reported (OpLedger::complete). Internal ops that owe
  // nobody a completion start with it set.
  bool completed = false;

  // Arms the deadline: `timeout` from now (deadline_after).
  void set_deadline(std::chrono::milliseconds t) {
    timeout = t;
    deadline = deadline_after(t);
  }
  void clear_deadline() {
    timeout = std::chrono::milliseconds(0);
    deadline = OpClock::time_point::max();
  }
  bool overdue(OpClock::time_point now) const { return deadline <= now; }

 private:
  template <typename>
  friend class OpTable;
  template <typename>
  friend class OpLedger;
  // OpTable
  uint32_t slot_ = 0;
  uint32_t generation_ = 0;
  bool live_ = false;
  // OpLedger
  bool listed_ = false;
  OpRecord* older_ = nullptr;
  OpRecord* newer_ = nullptr;
};

// Pooled ops. Slots are never freed while the table lives, so a pointer to an
// op stays valid memory; only its id tells whether it still is the same op.
template <typename Op>
class OpTable {
 public:
  // A fresh op (its OpRecord reset, a new id); the caller resets its own fields.
  // Allocates only while the pool grows.
  Op* acquire() {
    Op* op;
    if (!free_.empty()) {
      op = slots_[free_.back()].get();
      free_.pop_back();
    } else {
      slots_.push_back(std::make_unique<Op>());
      op = slots_.back().get();
      op->slot_ = static_cast<uint32_t>(slots_.size() - 1);
    }
    op->live_ = true;
    op->id = (uint64_t{op->generation_} << 32) | op->slot_;
    op->peer = -1;
    op->completed = false;
    op->clear_deadline();
    return op;
  }

  // Back to the pool; its id is refused by find() from now on. The op must not
  // be in a ledger any more (completed, or never listed).
  void release(Op* op) {
    if (!op->live_) return;
    op->live_ = false;
    ++op->generation_;
    free_.push_back(op->slot_);
  }

  // The live op with this id; nullptr for an id from before its slot was
  // recycled, or one this table never gave out.
  Op* find(uint64_t id) const {
    const uint64_t slot = id & 0xffffffffu;
    if (slot >= slots_.size()) return nullptr;
    Op* op = slots_[slot].get();
    if (!op->live_ || op->generation_ != static_cast<uint32_t>(id >> 32)) return nullptr;
    return op;
  }

  size_t live() const { return slots_.size() - free_.size(); }

 private:
  std::vector<std::unique_ptr<Op>> slots_;
  std::vector<uint32_t> free_;
};

// The ops still owed a completion, oldest first (the order they were added).
// Intrusive: adding, completing and removing touch only the op and its
// neighbours, never the allocator.
template <typename Op>
class OpLedger {
 public:
  OpLedger() = default;
  OpLedger(const OpLedger&) = delete;
  OpLedger& operator=(const OpLedger&) = delete;

  // From now on `op` is owed a completion: swept, and visited by for_each.
  void add(Op* op) {
    OpRecord* r = op;
    if (r->listed_ || r->completed) return;
    r->listed_ = true;
    r->older_ = newest_;
    r->newer_ = nullptr;
    (newest_ ? newest_->newer_ : oldest_) = r;
    newest_ = r;
    ++size_;
  }

  // Exactly once: true the first time for `op` (the caller then reports its
  // completion), false for every later call, which does nothing but count.
  bool complete(Op* op) {
    OpRecord* r = op;
    if (r->completed) {
      ++repeated_;
      return false;
    }
    r->completed = true;
    unlink(r);
    return true;
  }

  bool empty() const { return oldest_ == nullptr; }
  size_t size() const { return size_; }
  // complete() calls that found the op completed already.
  uint64_t repeated_completions() const { return repeated_; }

  // The earliest deadline of a listed op (time_point::max() when none).
  OpClock::time_point earliest_deadline() const {
    OpClock::time_point earliest = OpClock::time_point::max();
    for (const OpRecord* r = oldest_; r != nullptr; r = r->newer_) {
      if (r->deadline < earliest) earliest = r->deadline;
    }
    return earliest;
  }

  // Visits the listed ops, oldest first. `fn(Op&)` may complete the op it is
  // given (not another one).
  template <typename Fn>
  void for_each(Fn&& fn) {
    for (OpRecord* r = oldest_; r != nullptr;) {
      OpRecord* next = r->newer_;
      fn(*static_cast<Op*>(r));
      r = next;
    }
  }

  // The deadline sweep: every listed op whose deadline is at or before `now`,
  // oldest first, gets its timeout status (timeout_status with the op's name,
  // peer and timeout, and `state(op)`, the backend's words for where it stood)
  // and is handed to `expire(op, status)`, which completes it the backend's way
  // and returns true, or returns false to end the sweep there (say, because the
  // channel must fail instead). `where`: the sweep's caller, for the status.
  template <typename State, typename Expire>
  void sweep(OpClock::time_point now, State&& state, Expire&& expire,
             SourceLocation where = SourceLocation::current()) {
    for (OpRecord* r = oldest_; r != nullptr;) {
      OpRecord* next = r->newer_;
      if (r->overdue(now)) {
        Op& op = *static_cast<Op*>(r);
        if (!expire(op, timeout_status(op.name(), op.peer, op.timeout, state(op), where))) return;
      }
      r = next;
    }
  }

 private:
  void unlink(OpRecord* r) {
    if (!r->listed_) return;
    r->listed_ = false;
    (r->older_ ? r->older_->newer_ : oldest_) = r->newer_;
    (r->newer_ ? r->newer_->older_ : newest_) = r->older_;
    r->older_ = r->newer_ = nullptr;
    --size_;
  }

  OpRecord* oldest_ = nullptr;
  OpRecord* newest_ = nullptr;
  size_t size_ = 0;
  uint64_t repeated_ = 0;
};

}  // namespace rdmaflow
