// TcpChannel, receiver side: the receive path, run by the progress thread or by
// a waiter driving the channel (see the thread model in tcp_channel.h), and the
// handling of each frame type.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_channel_internal.h"
#include "transport/tcp/tcp_frame.h"

namespace rdmaflow::tcp {

namespace {

constexpr size_t kDiscardBytes = 64 << 10;   // sink for refused payloads
constexpr uint64_t kBulkPayload = 64 << 10;  // after a payload this big, a small window
// What is read after a bulk payload: the next header, and room for a small
// frame before it (a slot credit travels between two pieces: credit header,
// its 8 bytes, then the next piece's header, 152 bytes). Reading the header
// alone cost a recvmsg per piece; at most this much of a following bulk
// payload is staged and copied out.
constexpr size_t kBulkWindow = 256;
constexpr size_t kReceiveBudget = 8 << 20;  // bytes one receive turn may take in

}  // namespace

// ----------------------------------------------------------------- receiving

uint8_t* TcpChannel::discard_buffer() {
  if (!rx_.discard) rx_.discard = std::make_unique<uint8_t[]>(kDiscardBytes);
  return rx_.discard.get();
}

bool TcpChannel::peer_queue_full_locked() const {
  const uint64_t queued = (ctrl_.size() - ctrl_head_) + (pending_.size() - pending_user_ops_);
  return queued >= options_.max_peer_queued;
}

bool TcpChannel::queue_full() {
  fail(RDMAFLOW_ERROR(Code::kResourceExhausted, "receive", peer_,
                      "peer rank " + std::to_string(peer_) + " left " +
                          std::to_string(options_.max_peer_queued) +
                          " replies queued without reading them (RDMAFLOW_MAX_PEER_QUEUED=" +
                          std::to_string(options_.max_peer_queued) + ")"));
  return false;
}

bool TcpChannel::protocol_error(const std::string& why) {
  fail(RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_,
                      "malformed frame from peer rank " + std::to_string(peer_) + ": " + why));
  return false;
}

bool TcpChannel::forged_key(const Status& why) {
  // Before a byte of the payload is read.
  fail(forged_secret_failure("tcp", why, peer_));
  return false;
}

void TcpChannel::begin_payload(uint64_t len, uint8_t* target) {
  rx_.in_payload = true;
  rx_.remaining = len;
  rx_.target = target;
  rx_.granted = false;  // on_header marks a write's target
}

bool TcpChannel::enter_target() {
  if (rx_.landing) {
    if (landings_->enter(*rx_.landing)) return true;
    rx_.target = nullptr;  // withdrawn: the rest of the frame lands nowhere
    return false;
  }
  if (!rx_.granted) return true;
  while (!grants_->enter(rx_.gen)) {
    // Some grant was revoked since this chunk was checked: is ours still there?
    rx_.gen = grants_->generation();
    const FrameHeader& h = rx_.hdr;
    Status st = grants_->recheck(h.key_id, h.secret, h.offset + (h.length - rx_.remaining),
                                 rx_.remaining, rx_.target, "write (remote side)", peer_);
    if (!st.is_ok()) {
      // Revoked mid-write: what arrived before the revoke stays, nothing lands after.
      rx_.refusal = st;
      rx_.target = nullptr;
      rx_.granted = false;
      return false;
    }
  }
  return true;
}

void TcpChannel::leave_target() {
  if (rx_.landing) {
    landings_->leave(*rx_.landing);
  } else if (rx_.granted) {
    grants_->leave(rx_.gen);
  }
}

// The turn emptied the socket after taking a burst of many segments. Its
// sender may be waiting for our ACK to open its congestion window (counted in
// segments: a few dozen on a 1500-byte link), and the kernel holds that ACK
// back: a receiver that also sends is taken for interactive (delayed ACK), and
// reading the data does not open a multi-megabyte window enough to ACK. Until
// the timer fires, milliseconds, nothing moves (4 hosts x 1, 256 KiB: 30-70
// such stalls per 400 calls, 40% of the run; docs/tcp_transport.md "Delayed
// ACKs"). TCP_QUICKACK sends the pending ACK now. Small reads skip it, and so
// do loopback's 64 KiB segments: a window of them is not what a burst fills.
void TcpChannel::ack_now(size_t taken) {
  if (quickack_bytes_ == 0 || taken < quickack_bytes_) return;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

// Reads and processes what the socket holds, up to a budget (the caller
// re-arms; level-triggered readiness brings it back if more is waiting).
void TcpChannel::receive_turn(bool block) {
  if (rx_stopped_.load()) return;
  size_t budget = kReceiveBudget;
  for (bool first = true;; first = false) {
    if (!parse_staged()) return;
    // Compose the next read: the rest of the current payload straight into its
    // target, followed by room for the next frames (a small window after a
    // bulk payload, so little bulk data is ever staged).
    iovec iov[2];
    int count = 0;
    size_t want = 0;
    // A payload read straight into a grant's memory runs inside the grant fence.
    const bool fenced = rx_.in_payload && rx_.target != nullptr && enter_target();
    if (rx_.in_payload) {
      uint8_t* dst = rx_.target != nullptr ? rx_.target : discard_buffer();
      size_t n =
          rx_.target != nullptr ? rx_.remaining : std::min<uint64_t>(rx_.remaining, kDiscardBytes);
      iov[count++] = {dst, n};
      rx_.begin = rx_.end = 0;
      size_t room = rx_.hdr.length >= kBulkPayload ? kBulkWindow : kStageBytes;
      iov[count++] = {rx_.stage.get(), room};
    } else {
      size_t have = rx_.end - rx_.begin;
      if (rx_.begin > 0) {
        std::memmove(rx_.stage.get(), rx_.stage.get() + rx_.begin, have);
        rx_.begin = 0;
        rx_.end = have;
      }
      size_t room = (rx_.bulk_window ? kBulkWindow : kStageBytes) - have;  // have < a header
      iov[count++] = {rx_.stage.get() + have, room};
    }
    for (int i = 0; i < count; ++i) want += iov[i].iov_len;
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(count);
    // A driving inbox waiter blocks in its first recvmsg (SO_RCVTIMEO bounds it).
    ssize_t n = ::recvmsg(fd_, &m, block && first ? 0 : MSG_DONTWAIT);
    if (n > 0) rx_calls_.fetch_add(1, std::memory_order_relaxed);
    if (fenced) leave_target();
    if (n == 0) {
      fail(RDMAFLOW_ERROR(Code::kPeerFailed, "receive", peer_,
                          "connection closed by peer rank " + std::to_string(peer_)));
      return;
    }
    if (n < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      fail(RDMAFLOW_ERROR(
          Code::kPeerFailed, "receive", peer_,
          "connection to peer rank " + std::to_string(peer_) + " broke: " + errno_text(err)));
      return;
    }
    size_t got = static_cast<size_t>(n);
    if (rx_.in_payload) {
      size_t into_payload = std::min(got, iov[0].iov_len);
      if (rx_.target != nullptr) rx_.target += into_payload;
      rx_.remaining -= into_payload;
      rx_.end = got - into_payload;
      if (rx_.remaining == 0) {
        rx_.in_payload = false;
        if (!on_payload_done()) return;
      }
    } else {
      rx_.end += got;
    }
    budget -= std::min(budget, got);
    if (got < want) {  // socket drained
      if (!parse_staged()) return;
      ack_now(kReceiveBudget - budget);
      break;
    }
    if (budget == 0) break;
  }
  if (has_sent_no_ack_.load(std::memory_order_relaxed)) {
    DoneList done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      settle_sent_locked(done);
    }
    deliver(done, true);
  }
  if (rx_delivered_ && !loop_->on_loop_thread()) {
    // A waiter took a notify or message: its thread is likely to answer at once.
    // Let the ACKs ride along with that answer (one segment, one wake-up for the
    // peer) instead of going out alone; flush_deferred() is the backstop.
    rx_delivered_ = false;
    deferred_since_ns_.store(Clock::now().time_since_epoch().count());
    ack_deferred_.store(true);
    loop_->request_ticks();
    return;
  }
  rx_delivered_ = false;
  kick_sender();
}

bool TcpChannel::flush_deferred(Clock::time_point now, Clock::duration after) {
  if (!ack_deferred_.load(std::memory_order_relaxed)) return false;
  auto since = Clock::time_point(Clock::duration(deferred_since_ns_.load()));
  if (now - since < after) return true;
  ack_deferred_.store(false);
  kick_sender();
  return false;
}

bool TcpChannel::parse_staged() {
  for (;;) {
    if (rx_stopped_.load()) return false;
    if (rx_.in_payload) {
      size_t avail = rx_.end - rx_.begin;
      if (avail == 0) return true;
      size_t take = static_cast<size_t>(std::min<uint64_t>(avail, rx_.remaining));
      if (rx_.target != nullptr && enter_target()) {
        std::memcpy(rx_.target, rx_.stage.get() + rx_.begin, take);
        leave_target();
        rx_.target += take;
      }
      rx_.begin += take;
      rx_.remaining -= take;
      if (rx_.remaining > 0) return true;
      rx_.in_payload = false;
      if (!on_payload_done()) return false;
      continue;
    }
    if (rx_.end - rx_.begin < sizeof(FrameHeader)) return true;
    std::memcpy(&rx_.hdr, rx_.stage.get() + rx_.begin, sizeof(FrameHeader));
    rx_.begin += sizeof(FrameHeader);
    rx_.bulk_window = false;
    if (!on_header()) return false;
  }
}

bool TcpChannel::on_header() {
  const FrameHeader& h = rx_.hdr;
  if (std::string why = check_frame_header(h, options_.limits); !why.empty()) {
    return protocol_error(why);
  }
  auto type = static_cast<FrameType>(h.type);
  rx_.op = nullptr;
  rx_.landing.reset();  // only a write frame's payload may go to a landing
  switch (type) {
    case FrameType::kWrite: {
      if (rx_.has_poisoned && rx_.poisoned_op != h.op_id) rx_.has_poisoned = false;
      uint8_t* dst = nullptr;
      rx_.refusal = Status::ok();
      rx_.gen = grants_->generation();  // before resolving: a revoke after it is seen
      if (!rx_.has_poisoned) {
        rx_.refusal = resolve_write_target(*grants_, h, peer_, &dst);
        if (rx_.refusal.code() == Code::kUnauthenticated) return forged_key(rx_.refusal);
      }
      if (!rx_.refusal.is_ok() || rx_.has_poisoned) dst = nullptr;
      // A landing posted for this memory takes the frame whole (tcp_landing.h).
      rx_.landing = dst != nullptr ? landings_->match(peer_, dst, h.length) : nullptr;
      if (rx_.landing) {
        rx_.landing_offset = static_cast<size_t>(dst - rx_.landing->at);
        dst = rx_.landing->dst + rx_.landing_offset;
      }
      begin_payload(h.length, dst);
      rx_.granted = rx_.target != nullptr && !rx_.landing;
      break;
    }
    case FrameType::kWriteAck:
    case FrameType::kWriteNack:
    case FrameType::kReadNack: {
      rx_.bytes.resize(h.length);
      begin_payload(h.length, rx_.bytes.data());
      break;
    }
    case FrameType::kReadRequest: {
      uint8_t* src = nullptr;
      bool full = false;
      const uint64_t gen = grants_->generation();  // before resolving: a revoke after it is seen
      Status st = grants_->resolve(h.key_id, h.secret, h.offset, h.value, &src,
                                   "read (remote side)", peer_);
      if (st.code() == Code::kUnauthenticated) return forged_key(st);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return false;
        if (peer_queue_full_locked()) {
          full = true;  // fails the channel below, outside the lock
        } else if (st.is_ok()) {
          Op* op = new_op_locked(Op::kServeRead, nullptr, Millis(0));
          op->header.type = static_cast<uint8_t>(FrameType::kReadResponse);
          op->header.op_id = h.op_id;
          op->src = src;
          op->len = h.value;
          op->key_id = h.key_id;
          op->key_secret = h.secret;
          op->key_offset = h.offset;
          op->grant_gen = gen;
          enqueue_locked(op);
        } else {
          FrameHeader nack;
          nack.type = static_cast<uint8_t>(FrameType::kReadNack);
          nack.op_id = h.op_id;
          nack.code = static_cast<uint16_t>(st.code());
          std::string reason = st.reason();
          if (reason.size() > kMaxReasonBytes) reason.resize(kMaxReasonBytes);
          enqueue_ctrl_locked(nack, std::move(reason));
        }
      }
      if (full) return queue_full();
      begin_payload(0, nullptr);
      break;
    }
    case FrameType::kReadResponse: {
      uint8_t* dst = nullptr;
      bool mismatch = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Op* op = ops_.find(h.op_id);
        if (op != nullptr) {
          mismatch = op->kind != Op::kRead || op->queued || h.offset != op->received ||
                     h.length > op->len - op->received;
          if (!mismatch) {
            rx_.op = op;
            dst = op->dst + h.offset;
          }
        }
      }
      if (mismatch) {
        return protocol_error("read response does not match its request (offset " +
                              std::to_string(h.offset) + ", " + std::to_string(h.length) +
                              " bytes)");
      }
      // An unknown op id is a read that already timed out: drop its data.
      begin_payload(h.length, dst);
      break;
    }
    case FrameType::kMessage: {
      rx_.bytes.resize(h.length);
      begin_payload(h.length, rx_.bytes.data());
      break;
    }
  }
  if (rx_.remaining == 0) {
    rx_.in_payload = false;
    return on_payload_done();
  }
  return true;
}

bool TcpChannel::on_payload_done() {
  const FrameHeader& h = rx_.hdr;
  rx_.bulk_window = h.length >= kBulkPayload;
  auto type = static_cast<FrameType>(h.type);
  const bool last = (h.flags & kFlagLast) != 0;
  DoneList done;
  bool notify = false;
  bool full = false;
  std::string violation;
  switch (type) {
    case FrameType::kWrite: {
      if (rx_.landing) {  // its bytes are in the landing, unless it was withdrawn
        if (rx_.target != nullptr) landings_->landed(*rx_.landing, rx_.landing_offset, h.length);
        rx_.landing.reset();
      }
      if (rx_.has_poisoned) {  // an earlier chunk of this write was refused
        if (last) rx_.has_poisoned = false;
        break;
      }
      if (!rx_.refusal.is_ok() && (h.flags & kFlagNoAck) && rx_.refusal.code() == Code::kNotFound &&
          grants_->state(h.key_id) == GrantTable::KeyState::kRevoked) {
        // A posted write to a key this side issued and has since revoked: the
        // peer wrote before it could know (a collective's late credit, after
        // the communicator's drain gave up). Nothing lands, as for any refusal,
        // but nobody waits for the outcome and the revoker has moved on, so
        // it is dropped instead of failing the writer's channel (ucx drops a
        // notify for a revoked key alike). Never-issued keys, wrong secrets
        // and ranges outside a live grant still refuse.
        RDMAFLOW_LOG_DEBUG("tcp: rank {}: posted write for revoked key id {} dropped", peer_,
                           h.key_id);
        if (!last) {
          rx_.has_poisoned = true;
          rx_.poisoned_op = h.op_id;
        }
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) return false;
      if ((last || !rx_.refusal.is_ok()) && peer_queue_full_locked()) {
        full = true;
        break;
      }
      if (!rx_.refusal.is_ok()) {
        FrameHeader nack;
        nack.type = static_cast<uint8_t>(FrameType::kWriteNack);
        nack.op_id = h.op_id;
        nack.code = static_cast<uint16_t>(rx_.refusal.code());
        nack.flags = h.flags & kFlagNoAck;  // the initiator fails its channel on it
        std::string reason = rx_.refusal.reason();
        if (reason.size() > kMaxReasonBytes) reason.resize(kMaxReasonBytes);
        enqueue_ctrl_locked(nack, std::move(reason));
        if (!last) {
          rx_.has_poisoned = true;
          rx_.poisoned_op = h.op_id;
        }
        break;
      }
      if (last) {
        if (!(h.flags & kFlagNoAck)) {  // a posted write completed when it was sent
          FrameHeader ack;
          ack.type = static_cast<uint8_t>(FrameType::kWriteAck);
          ack.op_id = h.op_id;
          enqueue_ctrl_locked(ack, {});
        }
        notify = (h.flags & kFlagHasNotify) != 0;
      }
      break;
    }
    case FrameType::kWriteAck:
    case FrameType::kWriteNack:
    case FrameType::kReadNack: {
      bool is_write = type != FrameType::kReadNack;
      Status st;
      if (type != FrameType::kWriteAck) {
        auto code = static_cast<Code>(h.code);
        if (h.code == 0 || h.code > static_cast<uint16_t>(Code::kInternal)) code = Code::kInternal;
        st = Status(code, is_write ? "write" : "read", peer_,
                    "refused by peer rank " + std::to_string(peer_) + ": " +
                        std::string(rx_.bytes.begin(), rx_.bytes.end()));
      }
      if (type == FrameType::kWriteNack && (h.flags & kFlagNoAck)) {
        // A posted write was refused after it completed: nobody else can
        // learn of it, so the channel fails (sticky), naming the reason.
        fail(st);
        return false;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) return false;
      Op* op = ops_.find(h.op_id);
      if (op == nullptr) break;  // already timed out
      if (op->kind != (is_write ? Op::kWrite : Op::kRead) ||
          (type == FrameType::kWriteAck && op->queued)) {
        violation =
            "reply to an operation that cannot have one (op id " + std::to_string(h.op_id) + ")";
        break;
      }
      if (op->in_batch) {  // its last frame is still being settled by the sender
        op->finish_pending = true;
        op->finish_status = st;
      } else {
        complete_locked(op, st, done);
      }
      break;
    }
    case FrameType::kReadRequest:
      break;
    case FrameType::kReadResponse: {
      Op* op = rx_.op;
      rx_.op = nullptr;
      if (op == nullptr) break;  // the read timed out; its data was dropped
      std::lock_guard<std::mutex> lock(mu_);
      op->received += h.length;
      if (!last) break;
      Status st = op->received == op->len
                      ? Status::ok()
                      : RDMAFLOW_ERROR(Code::kProtocolError, "read", peer_,
                                       "peer rank " + std::to_string(peer_) + " sent " +
                                           std::to_string(op->received) + " of " +
                                           std::to_string(op->len) + " bytes");
      if (op->in_batch) {
        op->finish_pending = true;
        op->finish_status = st;
      } else {
        complete_locked(op, st, done);
      }
      break;
    }
    case FrameType::kMessage:
      inbox_.push_message(std::move(rx_.bytes));
      rx_.bytes = {};
      break;
  }
  if (!violation.empty()) return protocol_error(violation);
  if (full) return queue_full();
  // The notify goes to the inbox only now that every byte is in memory; the
  // ACK queued above goes out when the receive turn ends.
  if (notify) inbox_.push_notify(h.value);
  if (notify || type == FrameType::kMessage) rx_delivered_ = true;
  deliver(done, true);
  if (notify || type == FrameType::kMessage) loop_->wake_waiters(thread_event_fd());
  return !rx_stopped_.load();
}

}  // namespace rdmaflow::tcp
