// Flow control of one verbs channel, as plain logic (no verbs calls).
//
// SendWindow bounds the work requests posted on a queue pair: at most
// `capacity` send-queue slots are in flight; everything else waits in a FIFO
// behind it and is released, in order, as completions return slots. Every
// posted work request is signaled, and the channel's send CQ has `capacity`
// entries, so the CQ can never overrun.
//
// CreditCounter is the receive-side flow control. A SEND or a
// RDMA_WRITE_WITH_IMM consumes one receive buffer at the peer. The peer
// reserves `window` buffers for this channel in its shared receive queue and
// announces the number in its connection hello; each buffer it processes and
// re-posts is one credit owed back. Credits ride on every SEND header, and an
// explicit credit message goes out when `threshold` (window / 2) are owed.
// A credit message consumes a buffer too, so ordinary traffic may only spend
// credits down to 1: the last credit is reserved for a credit message, which
// keeps two peers that both ran dry from deadlocking (the one that spends its
// reserved credit hands the other >= threshold credits, so that one can answer).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace rdmaflow::verbs {

template <typename T>
class SendWindow {
 public:
  explicit SendWindow(uint32_t capacity) : capacity_(capacity < 2 ? 2 : capacity) {}

  uint32_t capacity() const { return capacity_; }
  uint32_t in_flight() const { return in_flight_; }
  uint32_t free_slots() const { return capacity_ - in_flight_; }
  size_t queued() const { return queue_.size(); }
  bool empty() const { return queue_.empty() && in_flight_ == 0; }

  // Queues an item needing `slots` (1..capacity) send-queue entries.
  void push(T item, uint32_t slots) {
    if (slots == 0) slots = 1;
    if (slots > capacity_) slots = capacity_;
    queue_.push_back({std::move(item), slots});
  }

  // Takes the head of the queue if its slots fit and `ready(item)` agrees
  // (other resources: credits, buffers). Reserves the slots. FIFO: a head that
  // does not fit blocks the items behind it, which keeps ordered messages ordered.
  template <typename Ready>
  std::optional<std::pair<T, uint32_t>> pop_ready(Ready&& ready) {
    if (queue_.empty()) return std::nullopt;
    auto& head = queue_.front();
    if (head.slots > free_slots() || !ready(head.item)) return std::nullopt;
    std::pair<T, uint32_t> out{std::move(head.item), head.slots};
    queue_.pop_front();
    in_flight_ += out.second;
    return out;
  }

  // The item at the head of the queue, if any.
  const T* front() const { return queue_.empty() ? nullptr : &queue_.front().item; }

  // Visits the queued items in order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const auto& e : queue_) fn(e.item);
  }

  // Reserves slots for an item that bypasses the queue (credit messages).
  bool try_reserve(uint32_t slots) {
    if (slots > free_slots()) return false;
    in_flight_ += slots;
    return true;
  }

  // Returns slots of completed work requests. Returns false (and clamps) when
  // more slots are released than were in flight: a bookkeeping bug.
  bool release(uint32_t slots) {
    if (slots > in_flight_) {
      in_flight_ = 0;
      return false;
    }
    in_flight_ -= slots;
    return true;
  }

  // Removes queued items matching `pred` (timeouts), in queue order.
  template <typename Pred>
  std::vector<T> remove_if(Pred&& pred) {
    std::vector<T> out;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (pred(it->item)) {
        out.push_back(std::move(it->item));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  // Empties the queue and forgets in-flight slots (the channel failed).
  std::vector<T> take_all() {
    std::vector<T> out;
    for (auto& e : queue_) out.push_back(std::move(e.item));
    queue_.clear();
    in_flight_ = 0;
    return out;
  }

 private:
  struct Entry {
    T item;
    uint32_t slots;
  };
  uint32_t capacity_;
  uint32_t in_flight_ = 0;
  std::deque<Entry> queue_;
};

class CreditCounter {
 public:
  // `peer_window`: buffers the peer reserved for us (its hello); our initial credits.
  // `local_window`: buffers we reserved for the peer; sets the return threshold.
  CreditCounter(uint32_t peer_window, uint32_t local_window);

  // Sets the peer's window once its hello arrives (an active-side channel may
  // receive, and so owe credits, before it knows the peer's window). Only valid
  // before anything was sent.
  void open_peer_window(uint32_t peer_window) {
    peer_window_ = peer_window;
    available_ = peer_window;
  }

  // --- sending side ---
  uint32_t available() const { return available_; }
  uint32_t peer_window() const { return peer_window_; }
  // Ordinary traffic keeps the last credit for credit messages.
  bool can_send() const { return available_ >= 2; }
  bool can_send_credit_message() const { return available_ >= 1; }
  // Spends one credit; false (and no change) if none may be spent.
  bool consume(bool credit_message);
  // The peer returned `n` credits. False when that would exceed the peer's
  // window (a protocol violation by the peer); nothing changes then.
  bool grant(uint32_t n);

  // --- receiving side ---
  uint32_t threshold() const { return threshold_; }
  uint32_t owed() const { return owed_; }
  // One buffer of the peer's was processed and re-posted.
  void on_buffer_reposted() { ++owed_; }
  // Credits to piggyback on an outgoing SEND; resets the owed count.
  uint32_t take_owed() { return std::exchange(owed_, 0); }
  // An explicit credit message is due (and can be sent).
  bool credit_message_due() const { return owed_ >= threshold_ && can_send_credit_message(); }

 private:
  uint32_t peer_window_;
  uint32_t available_;
  uint32_t threshold_;
  uint32_t owed_ = 0;
};

// The smallest window with which the reserved-credit scheme makes progress.
inline constexpr uint32_t kMinCreditWindow = 4;

}  // namespace rdmaflow::verbs
