// TcpChannel, sender side: issuing operations, building batches of frames and
// writing them with the combining sender (see the thread model in tcp_channel.h).
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <string>

#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_channel_internal.h"

namespace rdmaflow::tcp {

namespace {

constexpr size_t kSendBudget = 8 << 20;  // bytes one pump() turn may send

}  // namespace

// ---------------------------------------------------------------- operations

Status TcpChannel::check_key(const RemoteKey& key, uint64_t offset, uint64_t len,
                             const char* op) const {
  return check_key_use(key, "tcp", offset, len, op, peer_);
}

void TcpChannel::submit(Op* op, std::unique_lock<std::mutex>& lock) {
  if (driver_) attach_wait_driver(op->done, driver_);
  enqueue_locked(op);
  bool become_sender = sender_ == Sender::kIdle;
  if (become_sender) sender_ = Sender::kActive;
  lock.unlock();
  loop_->request_ticks();
  if (become_sender) pump();
}

void TcpChannel::submit_held(Op* op, std::unique_lock<std::mutex>& lock, int hold) {
  if (driver_) attach_wait_driver(op->done, driver_);
  enqueue_locked(op);
  op->held = true;
  held_total_.fetch_add(1, std::memory_order_relaxed);
  if (++held_count_ == 1) {
    held_since_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    has_held_.store(true, std::memory_order_relaxed);
  }
  // A busy sender takes it with the frames in front of it; an idle one is
  // only started when too many are held (the one over `hold` goes, and the
  // FIFO order sends the held ones first). Hold 0 inside a waiter's step:
  // gathered until the step ends (StepGather).
  const bool gather = hold == 0 && StepGather::active();
  bool become_sender =
      !gather && sender_ == Sender::kIdle && held_count_ > static_cast<size_t>(hold);
  if (become_sender) sender_ = Sender::kActive;
  lock.unlock();
  // Sent now (with any held before it): no backstop needed, and starting the
  // ticker would wake the progress thread for nothing (hold 0 is the default
  // for ranks with a core each).
  if (become_sender) return pump();
  if (gather) return StepGather::add(shared_from_this());
  loop_->request_ticks();  // flush_held() is the backstop
}

void TcpChannel::write_now(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                           std::optional<uint64_t> notify, Callback done, Millis timeout,
                           const Share* share, bool no_ack, int hold) {
  if (Status st = check_key(dst, dst_offset, len, "write"); !st.is_ok()) {
    return complete_soon(std::move(done), std::move(st));
  }
  if (src == nullptr && len > 0) {
    return complete_soon(std::move(done), RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_,
                                                         "null source buffer"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.ok()) {
    lock.unlock();
    return complete_soon(std::move(done), error_.for_op("write"));
  }
  Op* op = new_op_locked(Op::kWrite, std::move(done), timeout);
  FrameHeader& h = op->header;
  h.type = static_cast<uint8_t>(FrameType::kWrite);
  h.flags = static_cast<uint8_t>((notify ? kFlagHasNotify : 0) | (no_ack ? kFlagNoAck : 0));
  h.op_id = op->id;
  h.key_id = dst.key_id;
  h.secret = dst.secret;
  h.offset = dst_offset;
  h.value = notify.value_or(0);
  h.total = len;
  if (share != nullptr) {
    h.flags = kFlagShare;
    h.value = share->base;
    h.total = share->total;
  }
  op->src = static_cast<const uint8_t*>(src);
  op->len = len;
  if (hold >= 0 && share == nullptr) return submit_held(op, lock, hold);
  submit(op, lock);
}

void TcpChannel::read_now(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset,
                          Callback done, Millis timeout) {
  if (Status st = check_key(src, src_offset, len, "read"); !st.is_ok()) {
    return complete_soon(std::move(done), std::move(st));
  }
  if (dst == nullptr && len > 0) {
    return complete_soon(std::move(done), RDMAFLOW_ERROR(Code::kInvalidArgument, "read", peer_,
                                                         "null destination buffer"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.ok()) {
    lock.unlock();
    return complete_soon(std::move(done), error_.for_op("read"));
  }
  Op* op = new_op_locked(Op::kRead, std::move(done), timeout);
  FrameHeader& h = op->header;
  h.type = static_cast<uint8_t>(FrameType::kReadRequest);
  h.op_id = op->id;
  h.key_id = src.key_id;
  h.secret = src.secret;
  h.offset = src_offset;
  h.value = len;
  op->dst = static_cast<uint8_t*>(dst);
  op->len = len;
  submit(op, lock);
}

void TcpChannel::send_message_now(std::vector<uint8_t> bytes, Callback done, Millis timeout) {
  if (bytes.size() > options_.limits.max_message) {
    return complete_soon(std::move(done),
                         RDMAFLOW_ERROR(Code::kInvalidArgument, "send message", peer_,
                                        "message of " + std::to_string(bytes.size()) +
                                            " bytes exceeds RDMAFLOW_MAX_MESSAGE_BYTES=" +
                                            std::to_string(options_.limits.max_message)));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.ok()) {
    lock.unlock();
    return complete_soon(std::move(done), error_.for_op("send message"));
  }
  Op* op = new_op_locked(Op::kMessage, std::move(done), timeout);
  op->header.type = static_cast<uint8_t>(FrameType::kMessage);
  op->header.op_id = op->id;
  op->message = std::move(bytes);
  op->src = op->message.data();
  op->len = op->message.size();
  submit(op, lock);
}

// ------------------------------------------------------------------- sending

void TcpChannel::Batch::advance(size_t n) {
  while (n > 0 && iov_pos < iov_count) {
    iovec& v = iov[iov_pos];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++iov_pos;
    } else {
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

bool TcpChannel::build_batch_locked() {
  Batch& b = batch_;
  b.clear();
  if (options_.zerocopy_min > 0) std::fill(std::begin(b.zero_copy), std::end(b.zero_copy), false);
  while (ctrl_head_ < ctrl_.size() && b.frames < kBatchFrames) {
    Ctrl& c = ctrl_[ctrl_head_++];
    int f = b.frames++;
    b.headers[f] = c.header;
    b.reasons[f] = std::move(c.reason);
    b.headers[f].length = b.reasons[f].size();
    b.iov[b.iov_count++] = {&b.headers[f], sizeof(FrameHeader)};
    if (!b.reasons[f].empty()) b.iov[b.iov_count++] = {b.reasons[f].data(), b.reasons[f].size()};
  }
  if (ctrl_head_ == ctrl_.size()) {
    ctrl_.clear();
    ctrl_head_ = 0;
  }
  uint64_t payload = 0;
  while (send_head_ != nullptr && b.frames < kBatchFrames && payload < options_.chunk_bytes) {
    Op* op = send_head_;
    int f = b.frames++;
    FrameHeader& h = b.headers[f];
    h = op->header;
    bool last = true;
    b.from[b.op_count] = b.bytes[b.op_count] = 0;
    switch (op->kind) {
      case Op::kWrite:
      case Op::kServeRead: {
        if (op->kind == Op::kServeRead && op->emitted < op->len &&
            !serve_granted_locked(op, op->emitted, op->len - op->emitted)) {
          // Revoked between two chunks: the rest of the read is refused.
          h = FrameHeader{};
          h.type = static_cast<uint8_t>(FrameType::kReadNack);
          h.op_id = op->header.op_id;
          h.code = static_cast<uint16_t>(Code::kNotFound);
          b.reasons[f] = "key id " + std::to_string(op->key_id) + " was revoked after " +
                         std::to_string(op->emitted) + " of the " + std::to_string(op->len) +
                         " bytes read had been sent";
          h.length = b.reasons[f].size();
          b.iov[b.iov_count++] = {&h, sizeof(FrameHeader)};
          b.iov[b.iov_count++] = {b.reasons[f].data(), b.reasons[f].size()};
          op->len = op->emitted;
          break;
        }
        uint64_t chunk = std::min<uint64_t>(op->len - op->emitted, options_.chunk_bytes);
        h.length = chunk;
        h.offset = op->header.offset + op->emitted;
        last = op->emitted + chunk == op->len;
        h.flags = static_cast<uint8_t>(
            (op->header.flags & ~kFlagHasNotify) | (op->emitted == 0 ? kFlagFirst : 0) |
            (last ? kFlagLast | (op->header.flags & kFlagHasNotify) : 0));
        b.iov[b.iov_count++] = {&h, sizeof(FrameHeader)};
        if (chunk > 0) {
          // Zero copy only for acknowledged write payloads (see tcp_zerocopy.cc
          // for why not the others): a posted write completes once sent, while
          // the kernel may still hold its pages.
          b.zero_copy[b.iov_count] = op->kind == Op::kWrite && !(op->header.flags & kFlagNoAck) &&
                                     options_.zerocopy_min > 0 && chunk >= options_.zerocopy_min;
          b.iov[b.iov_count++] = {const_cast<uint8_t*>(op->src + op->emitted), chunk};
          if (op->kind == Op::kServeRead) b.serving = true;
        }
        b.from[b.op_count] = op->emitted;
        b.bytes[b.op_count] = chunk;
        op->emitted += chunk;
        payload += chunk;
        break;
      }
      case Op::kRead:
        h.length = 0;
        b.iov[b.iov_count++] = {&h, sizeof(FrameHeader)};
        break;
      case Op::kMessage:
        h.length = op->len;
        b.iov[b.iov_count++] = {&h, sizeof(FrameHeader)};
        if (op->len > 0) b.iov[b.iov_count++] = {const_cast<uint8_t*>(op->src), op->len};
        payload += op->len;
        break;
    }
    op->in_batch = true;
    b.ops[b.op_count] = op;
    b.op_last[b.op_count] = last;
    ++b.op_count;
    if (!last) break;  // at most one chunk of an op per batch
    unlink_locked(op);
  }
  return b.iov_count > 0;
}

void TcpChannel::settle_batch_locked(DoneList& done) {
  Batch& b = batch_;
  for (int i = 0; i < b.op_count; ++i) {
    Op* op = b.ops[i];
    op->in_batch = false;
    if (op->completed) continue;
    if (failed_) {
      complete_locked(op, error_.for_op(op->name()), done);
    } else if (op->finish_pending) {
      complete_locked(op, op->finish_status, done);
    } else if (b.op_last[i] && (op->kind == Op::kMessage || op->kind == Op::kServeRead)) {
      complete_locked(op, Status::ok(), done);
    } else if (b.op_last[i] && op->kind == Op::kWrite && (op->header.flags & kFlagNoAck)) {
      if (loop_->on_loop_thread()) {
        // The progress thread finished a posted write (its sender had parked on
        // a full socket): complete it now; deliver() wakes the waiters.
        complete_locked(op, Status::ok(), done);
        continue;
      }
      // Completing here would post the callback to the progress thread (a
      // wake-up per write) when the sender is a user thread: leave it to the
      // next receive turn, the driving waiter's settle_posted() or the sweep,
      // which run callbacks where they are.
      sent_no_ack_.push_back(op->id);
      has_sent_no_ack_.store(true, std::memory_order_relaxed);
    }
    // Writes wait for their ACK, reads for their response.
  }
  b.op_count = 0;
}

void TcpChannel::settle_sent_locked(DoneList& done) {
  if (!has_sent_no_ack_.load(std::memory_order_relaxed)) return;
  for (uint64_t id : sent_no_ack_) {
    if (Op* op = ops_.find(id)) complete_locked(op, Status::ok(), done);  // else timed out
  }
  sent_no_ack_.clear();
  has_sent_no_ack_.store(false, std::memory_order_relaxed);
}

void TcpChannel::pump() {
  ack_deferred_.store(false, std::memory_order_relaxed);  // ctrl frames go first in this batch
  DoneList done;
  size_t budget = kSendBudget;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (batch_.sent_all() || failed_) {
      settle_batch_locked(done);
      if (failed_) {
        batch_.clear();
        sender_ = Sender::kIdle;
        break;
      }
      if (!build_batch_locked()) {
        sender_ = Sender::kIdle;
        break;
      }
    }
    if (budget == 0) {
      // Let the progress thread continue, so neither a user thread nor the
      // receive side is held up by a long transfer.
      sender_ = Sender::kParked;
      lock.unlock();
      deliver(done);
      auto self = shared_from_this();
      loop_->post([self] { self->resume_sender(); });
      return;
    }
    // Bytes of a read being served leave from a grant's memory: inside the grant
    // fence, after checking that no revoke took the grant since the batch was built.
    uint64_t gen = 0;
    bool fenced = false;
    while (batch_.serving && !fenced) {
      gen = grants_->generation();
      const Op* revoked = nullptr;
      for (int i = 0; i < batch_.op_count && revoked == nullptr; ++i) {
        Op* op = batch_.ops[i];
        if (op->kind == Op::kServeRead && batch_.bytes[i] > 0 &&
            !serve_granted_locked(op, batch_.from[i], batch_.bytes[i])) {
          revoked = op;
        }
      }
      if (revoked != nullptr) {
        // Part of this chunk's frame is on the wire already: the stream cannot go
        // on (as an RDMA read through a dead rkey breaks its queue pair).
        Status st = RDMAFLOW_ERROR(
            Code::kNotFound, "serve read", peer_,
            "key id " + std::to_string(revoked->key_id) +
                " was revoked while a read through it was being sent; the stream cannot be "
                "resumed");
        sender_ = Sender::kIdle;
        sender_cv_.notify_all();
        lock.unlock();
        deliver(done);
        auto self = shared_from_this();
        loop_->post([self, st] { self->fail(st); });
        return;
      }
      fenced = grants_->enter(gen);
    }
    msghdr m{};
    m.msg_iov = batch_.iov + batch_.iov_pos;
    m.msg_iovlen = static_cast<size_t>(batch_.iov_count - batch_.iov_pos);
    // MSG_ZEROCOPY pins every page of the call, the batch's headers too, which
    // the next batch overwrites: a zero-copy payload goes in a call of its own,
    // and a copying call stops before it.
    const bool zc = options_.zerocopy_min > 0 && batch_.zero_copy[batch_.iov_pos];
    if (zc) {
      m.msg_iovlen = 1;
    } else if (options_.zerocopy_min > 0) {
      size_t k = 1;
      while (k < m.msg_iovlen && !batch_.zero_copy[batch_.iov_pos + k]) ++k;
      m.msg_iovlen = k;
    }
    lock.unlock();
    ssize_t n = ::sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL | (zc ? MSG_ZEROCOPY : 0));
    tx_calls_.fetch_add(1, std::memory_order_relaxed);
    int err = errno;
    if (zc && n < 0 && err == ENOBUFS) {  // out of pinned-page budget: copy this time
      n = ::sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
      err = errno;
    } else if (zc && n >= 0) {
      zc_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    if (fenced) grants_->leave(gen);
    lock.lock();
    if (n >= 0) {
      batch_.advance(static_cast<size_t>(n));
      budget -= std::min(budget, static_cast<size_t>(n));
      continue;
    }
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      sender_ = Sender::kParked;
      lock.unlock();
      deliver(done);
      wait_writable();
      return;
    }
    // Hand the failure to the progress thread; the batch's ops stay in_batch and
    // fail() (sender no longer active) completes them.
    sender_ = Sender::kIdle;
    sender_cv_.notify_all();
    lock.unlock();
    deliver(done);
    Status st = RDMAFLOW_ERROR(Code::kPeerFailed, "send", peer_, "send failed: " + errno_text(err));
    auto self = shared_from_this();
    loop_->post([self, st] { self->fail(st); });
    return;
  }
  sender_cv_.notify_all();
  lock.unlock();
  deliver(done);
}

void TcpChannel::wait_writable() {
  set_interest(true);
}

void TcpChannel::set_interest(bool want_out) {
  std::lock_guard<std::mutex> lock(arm_mu_);
  want_out_ = want_out;
  rearm_locked();
}

void TcpChannel::resume_sender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sender_ != Sender::kParked || failed_) return;
    sender_ = Sender::kActive;
  }
  pump();
}

void TcpChannel::kick_sender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sender_ != Sender::kIdle || failed_) return;
    // With the sender idle the FIFO holds nothing but held writes (any other
    // operation starts the sender): they wait for a frame to ride with.
    if (ctrl_head_ == ctrl_.size() && (send_head_ == nullptr || send_head_->held)) return;
    sender_ = Sender::kActive;
  }
  pump();
}

void TcpChannel::send_held() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || held_count_ == 0 || sender_ != Sender::kIdle) return;
    sender_ = Sender::kActive;
  }
  pump();
}

bool TcpChannel::flush_held(Clock::time_point now, Clock::duration after) {
  if (!has_held_.load(std::memory_order_relaxed)) return false;
  const auto since = Clock::time_point(Clock::duration(held_since_ns_.load()));
  if (now - since < after) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || held_count_ == 0) return false;
    if (sender_ != Sender::kIdle) return true;  // it sends them; look again next tick
    sender_ = Sender::kActive;
  }
  held_ticked_.fetch_add(1, std::memory_order_relaxed);
  pump();
  return has_held_.load(std::memory_order_relaxed);
}

bool TcpChannel::serve_granted_locked(Op* op, uint64_t from, uint64_t len) {
  const uint64_t gen = grants_->generation();
  if (op->grant_gen == gen) return true;
  if (!grants_
           ->recheck(op->key_id, op->key_secret, op->key_offset + from, len, op->src + from,
                     "read (remote side)", peer_)
           .is_ok()) {
    return false;
  }
  op->grant_gen = gen;
  return true;
}

}  // namespace rdmaflow::tcp
