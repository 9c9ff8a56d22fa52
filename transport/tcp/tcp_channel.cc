#include "transport/tcp/tcp_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/epoll.h>
#include <algorithm>
#include <cstdio>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace rdmaflow::tcp {

namespace {

constexpr size_t kStageBytes = 16 << 10;     // small-frame receive window
constexpr size_t kDiscardBytes = 64 << 10;   // sink for refused payloads
constexpr uint64_t kBulkPayload = 64 << 10;  // after a payload this big, read headers alone
constexpr size_t kSendBudget = 8 << 20;      // bytes one pump() turn may send
constexpr size_t kReceiveBudget = 8 << 20;   // bytes one receive turn may take in

Clock::time_point deadline_after(Millis timeout) {
  constexpr auto kMax = std::chrono::hours(24 * 365);
  if (timeout < Millis(0)) timeout = Millis(0);
  if (timeout > kMax) timeout = std::chrono::duration_cast<Millis>(kMax);
  return Clock::now() + timeout;
}

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

}  // namespace

// ------------------------------------------------------------------ driver

namespace {

// The WaitDriver attached to a channel's inbox and operations. Holds the
// channel weakly: the inbox it is attached to is a member of the channel.
class ChannelDriver final : public WaitDriver {
 public:
  // `exclusive`: only this channel can satisfy the wait (its inbox).
  ChannelDriver(std::weak_ptr<TcpChannel> ch, bool exclusive)
      : ch_(std::move(ch)), exclusive_(exclusive) {}
  bool drive(const std::function<bool()>& ready, Clock::time_point deadline) override {
    auto ch = ch_.lock();
    return ch ? ch->drive(ready, deadline, exclusive_) : false;
  }

 private:
  std::weak_ptr<TcpChannel> ch_;
  bool exclusive_;
};

// Each waiting thread has one eventfd, poked by IoLoop::wake_waiters().
struct ThreadEventFd {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~ThreadEventFd() {
    if (fd >= 0) ::close(fd);
  }
};

int thread_event_fd() {
  thread_local ThreadEventFd efd;
  return efd.fd;
}

}  // namespace

// One operation: a user write / read / message, or the serving side of a peer's
// read. Slots are recycled (no allocation per operation once warm); the id is
// (generation << 32 | slot) so a late reply never matches a recycled slot.
struct TcpChannel::Op {
  enum Kind : int { kWrite, kRead, kMessage, kServeRead };
  Kind kind = kWrite;
  bool live = false;
  bool queued = false;    // in the send FIFO (frames left to emit)
  bool in_batch = false;  // a frame of it is in the batch on the wire
  bool finish_pending = false;
  uint32_t gen = 0;
  uint32_t index = 0;
  uint64_t id = 0;
  Callback done;
  Clock::time_point deadline;
  Millis timeout{0};
  FrameHeader header;  // template of this op's frames
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t len = 0;
  uint64_t emitted = 0;   // payload bytes placed into batches
  uint64_t received = 0;  // read: response bytes received
  // Serving a read: the grant it reads through, checked again whenever the grant
  // table's generation moved (a revoke) before more of its bytes leave.
  uint64_t key_id = 0, key_secret = 0, key_offset = 0;
  uint64_t grant_gen = 0;
  std::vector<uint8_t> message;
  Status finish_status;
  Op* prev = nullptr;
  Op* next = nullptr;
};

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

TcpChannel::TcpChannel(std::shared_ptr<IoLoop> loop, std::shared_ptr<GrantTable> grants, int fd,
                       int self_rank, int peer_rank, TcpOptions options)
    : loop_(std::move(loop)),
      grants_(std::move(grants)),
      fd_(fd),
      self_(self_rank),
      peer_(peer_rank),
      options_(options) {
  if (options_.chunk_bytes == 0 || options_.chunk_bytes > kMaxChunkPayload) {
    options_.chunk_bytes = 1 << 20;
  }
  rx_.stage = std::make_unique<uint8_t[]>(kStageBytes);
  inbox_.set_peer(peer_);
}

TcpChannel::~TcpChannel() {
  {
    std::lock_guard<std::mutex> lock(arm_mu_);
    if (!unwatched_) loop_->unwatch(fd_, watch_id_);
    unwatched_ = true;
  }
  if (fd_ >= 0) ::close(fd_);
}

void TcpChannel::start() {
  watch_id_ = loop_->watch(fd_, weak_from_this());
  if (options_.drive_us > 0) {
    driver_ = std::make_shared<ChannelDriver>(weak_from_this(), false);
    inbox_.set_wait_driver(std::make_shared<ChannelDriver>(weak_from_this(), true));
    // A driving inbox waiter blocks in recvmsg, bounded by SO_RCVTIMEO; every
    // other call passes MSG_DONTWAIT, so the descriptor itself is left blocking.
    int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{0, static_cast<suseconds_t>(std::min<int64_t>(options_.drive_us, 500))};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::lock_guard<std::mutex> lock(arm_mu_);
  rearm_locked();
}

// ---------------------------------------------------------------- operations

const char* TcpChannel::op_name(const Op* op) const {
  switch (op->kind) {
    case Op::kWrite:
      return "write";
    case Op::kRead:
      return "read";
    case Op::kMessage:
      return "send message";
    case Op::kServeRead:
      return "serve read";
  }
  return "operation";
}

TcpChannel::Op* TcpChannel::new_op_locked(int kind, Callback done, Millis timeout) {
  Op* op;
  if (!free_slots_.empty()) {
    op = slots_[free_slots_.back()].get();
    free_slots_.pop_back();
  } else {
    slots_.push_back(std::make_unique<Op>());
    op = slots_.back().get();
    op->index = static_cast<uint32_t>(slots_.size() - 1);
  }
  op->kind = static_cast<Op::Kind>(kind);
  op->live = true;
  op->queued = op->in_batch = op->finish_pending = false;
  op->id = (static_cast<uint64_t>(op->gen) << 32) | op->index;
  op->done = std::move(done);
  op->timeout = timeout;
  op->deadline = kind == Op::kServeRead ? Clock::time_point::max() : deadline_after(timeout);
  op->header = FrameHeader{};
  op->src = nullptr;
  op->dst = nullptr;
  op->len = op->emitted = op->received = 0;
  op->finish_status = Status::ok();
  op->prev = op->next = nullptr;
  if (kind != Op::kServeRead) ++pending_user_ops_;
  return op;
}

TcpChannel::Op* TcpChannel::find_op_locked(uint64_t id) {
  uint64_t index = id & 0xffffffffu;
  if (index >= slots_.size()) return nullptr;
  Op* op = slots_[index].get();
  if (!op->live || op->gen != static_cast<uint32_t>(id >> 32)) return nullptr;
  return op;
}

void TcpChannel::unlink_locked(Op* op) {
  if (!op->queued) return;
  (op->prev ? op->prev->next : send_head_) = op->next;
  (op->next ? op->next->prev : send_tail_) = op->prev;
  op->prev = op->next = nullptr;
  op->queued = false;
}

void TcpChannel::enqueue_locked(Op* op) {
  op->prev = send_tail_;
  op->next = nullptr;
  (send_tail_ ? send_tail_->next : send_head_) = op;
  send_tail_ = op;
  op->queued = true;
}

void TcpChannel::enqueue_ctrl_locked(const FrameHeader& header, std::string reason) {
  ctrl_.push_back(Ctrl{header, std::move(reason)});
}

void TcpChannel::complete_locked(Op* op, const Status& status, DoneList& done) {
  unlink_locked(op);
  if (op->kind != Op::kServeRead) {
    done.push_back(Done{std::move(op->done), status});
    --pending_user_ops_;
  }
  op->done = nullptr;
  op->live = false;
  op->in_batch = false;
  ++op->gen;
  if (!op->message.empty()) std::vector<uint8_t>().swap(op->message);
  free_slots_.push_back(op->index);
}

void TcpChannel::deliver(DoneList& done, bool receive_path) {
  if (done.empty()) return;
  if (loop_->on_loop_thread() || (receive_path && holds_rx())) {
    for (auto& d : done) {
      if (d.cb) d.cb(d.status);
    }
    done.clear();
    loop_->wake_waiters(holds_rx() ? thread_event_fd() : -1);
    return;
  }
  loop_->post([d = std::move(done), loop = loop_.get()]() mutable {
    for (auto& x : d) {
      if (x.cb) x.cb(x.status);
    }
    loop->wake_waiters();
  });
  done.clear();
}

void TcpChannel::complete_soon(Callback done, Status status) {
  if (!done) return;
  loop_->post([cb = std::move(done), st = std::move(status), loop = loop_.get()] {
    cb(st);
    loop->wake_waiters();
  });
}

Status TcpChannel::check_key(const RemoteKey& key, uint64_t offset, uint64_t len,
                             const char* op) const {
  if (key.backend != "tcp") {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_,
                          "remote key belongs to backend '" + key.backend + "', not tcp");
  }
  if (!key.covers(offset, len)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer_,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(key.length) +
                              " bytes granted by key id " + std::to_string(key.key_id));
  }
  return Status::ok();
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

void TcpChannel::write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                       std::optional<uint64_t> notify, Callback done, Millis timeout) {
  if (Status st = check_key(dst, dst_offset, len, "write"); !st.is_ok()) {
    return complete_soon(std::move(done), std::move(st));
  }
  if (src == nullptr && len > 0) {
    return complete_soon(std::move(done), RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_,
                                                         "null source buffer"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) {
    Status st = error_.with_op("write");
    lock.unlock();
    return complete_soon(std::move(done), std::move(st));
  }
  Op* op = new_op_locked(Op::kWrite, std::move(done), timeout);
  FrameHeader& h = op->header;
  h.type = static_cast<uint8_t>(FrameType::kWrite);
  h.flags = notify ? kFlagHasNotify : 0;
  h.op_id = op->id;
  h.key_id = dst.key_id;
  h.secret = dst.secret;
  h.offset = dst_offset;
  h.value = notify.value_or(0);
  h.total = len;
  op->src = static_cast<const uint8_t*>(src);
  op->len = len;
  submit(op, lock);
}

void TcpChannel::read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset,
                      Callback done, Millis timeout) {
  if (Status st = check_key(src, src_offset, len, "read"); !st.is_ok()) {
    return complete_soon(std::move(done), std::move(st));
  }
  if (dst == nullptr && len > 0) {
    return complete_soon(std::move(done), RDMAFLOW_ERROR(Code::kInvalidArgument, "read", peer_,
                                                         "null destination buffer"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) {
    Status st = error_.with_op("read");
    lock.unlock();
    return complete_soon(std::move(done), std::move(st));
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

void TcpChannel::send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) {
  if (bytes.size() > kMaxMessageBytes) {
    return complete_soon(
        std::move(done),
        RDMAFLOW_ERROR(Code::kInvalidArgument, "send message", peer_,
                       "message of " + std::to_string(bytes.size()) +
                           " bytes exceeds the limit of " + std::to_string(kMaxMessageBytes)));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) {
    Status st = error_.with_op("send message");
    lock.unlock();
    return complete_soon(std::move(done), std::move(st));
  }
  Op* op = new_op_locked(Op::kMessage, std::move(done), timeout);
  op->header.type = static_cast<uint8_t>(FrameType::kMessage);
  op->header.op_id = op->id;
  op->message = std::move(bytes);
  op->src = op->message.data();
  op->len = op->message.size();
  submit(op, lock);
}

void TcpChannel::close() {
  Status st = RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_, "channel closed");
  if (loop_->on_loop_thread() || !loop_->running()) {
    fail(st);
    return;
  }
  struct Flag {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto flag = std::make_shared<Flag>();
  auto self = shared_from_this();
  loop_->post([self, st, flag] {
    self->fail(st);
    std::lock_guard<std::mutex> lock(flag->mu);
    flag->done = true;
    flag->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(flag->mu);
  flag->cv.wait_for(lock, std::chrono::seconds(10), [&] { return flag->done; });
}

Status TcpChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool TcpChannel::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_ && sender_ != Sender::kActive;
}

void TcpChannel::fail(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_) return;  // the first failure is the one reported
    failing_ = true;
    error_ = error;
  }
  rx_stopped_.store(true);
  // The peer sees EOF; a waiter polling or blocked in recvmsg on fd_ wakes up.
  ::shutdown(fd_, SHUT_RDWR);
  // Wait for a receive turn on another thread to end: it may be writing into a
  // buffer whose operation we are about to complete.
  std::unique_lock<std::mutex> rx_lock(rx_mu_, std::defer_lock);
  if (!holds_rx()) rx_lock.lock();
  DoneList done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    rx_.op = nullptr;
    // An active sender is inside sendmsg() with the batch; it settles those ops.
    bool sender_busy = sender_ == Sender::kActive;
    if (!sender_busy) {
      for (int i = 0; i < batch_.op_count; ++i) batch_.ops[i]->in_batch = false;
      batch_.clear();
      sender_ = Sender::kIdle;
    }
    for (auto& slot : slots_) {
      Op* op = slot.get();
      if (!op->live || (sender_busy && op->in_batch)) continue;
      complete_locked(op, error_.with_op(op_name(op)), done);
    }
    ctrl_.clear();
    ctrl_head_ = 0;
  }
  {
    std::lock_guard<std::mutex> lock(arm_mu_);
    if (!unwatched_) loop_->unwatch(fd_, watch_id_);
    unwatched_ = true;
  }
  if (rx_lock.owns_lock()) rx_lock.unlock();
  RDMAFLOW_LOG_DEBUG("tcp channel to rank {} failed: {}", peer_, error.to_string());
  deliver(done, true);
  inbox_.fail(error);
  loop_->wake_waiters();
}

void TcpChannel::release_socket() {
  // fail() already shut the socket down; wait for threads still using it.
  for (int i = 0; i < 1000 && driving_.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::unique_lock<std::mutex> lock(mu_);
  sender_cv_.wait_for(lock, std::chrono::seconds(5), [&] { return sender_ != Sender::kActive; });
}

bool TcpChannel::sweep(Clock::time_point now) {
  DoneList done;
  bool must_fail = false;
  Status fail_status;
  bool pending;
  {
    // rx_.op may point at an op we complete. A driving waiter holds rx_mu_ (maybe
    // blocked in recvmsg): sweep this channel on a later tick instead of waiting.
    std::unique_lock<std::mutex> rx_lock(rx_mu_, std::try_to_lock);
    if (!rx_lock.owns_lock()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return false;
    for (auto& slot : slots_) {
      Op* op = slot.get();
      if (!op->live || op->kind == Op::kServeRead || op->deadline > now) continue;
      std::string waited = std::to_string(op->timeout.count()) + " ms";
      if (op->in_batch) {
        must_fail = true;
        fail_status = RDMAFLOW_ERROR(
            Code::kTimeout, "channel", peer_,
            std::string(op_name(op)) + " timed out after " + waited +
                " while being transmitted (peer not reading); the stream cannot be resumed");
        break;
      }
      std::string state = op->queued ? (op->emitted > 0 ? "partly sent" : "still queued to send")
                                     : "sent, no reply from the peer";
      if (op == rx_.op) {  // its response is arriving: drop the rest of the chunk
        rx_.op = nullptr;
        rx_.target = nullptr;
      }
      complete_locked(op,
                      RDMAFLOW_ERROR(Code::kTimeout, op_name(op), peer_,
                                     "not completed within " + waited + " (" + state + ")"),
                      done);
    }
    pending = pending_user_ops_ > 0;
  }
  deliver(done);
  if (must_fail) {
    fail(fail_status);
    return false;
  }
  return pending;
}

// ------------------------------------------------------------------- sending

bool TcpChannel::build_batch_locked() {
  Batch& b = batch_;
  b.clear();
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
    if (!op->live) continue;
    if (failed_) {
      complete_locked(op, error_.with_op(op_name(op)), done);
    } else if (op->finish_pending) {
      complete_locked(op, op->finish_status, done);
    } else if (b.op_last[i] && (op->kind == Op::kMessage || op->kind == Op::kServeRead)) {
      complete_locked(op, Status::ok(), done);
    }
    // Writes wait for their ACK, reads for their response.
  }
  b.op_count = 0;
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
    lock.unlock();
    ssize_t n = ::sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    int err = errno;
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

void TcpChannel::rearm_locked() {
  if (unwatched_) return;
  uint32_t events = 0;
  if (!rx_waiter_ && !rx_stopped_.load()) events |= EPOLLIN | EPOLLRDHUP;
  if (want_out_) events |= EPOLLOUT;
  loop_->arm(fd_, watch_id_, events);
}

void TcpChannel::on_fd_event(uint32_t events) {
  // One-shot: fd_ is disarmed until rearm_locked().
  bool resume = false;
  bool receive = false;
  {
    std::lock_guard<std::mutex> lock(arm_mu_);
    if (unwatched_) return;
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && want_out_) {
      want_out_ = false;
      resume = true;
    }
    receive = (events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) && !rx_waiter_;
  }
  if (resume) resume_sender();
  if (receive) {
    // try_lock: a waiter that raced us to the socket may be blocked in recvmsg.
    std::unique_lock<std::mutex> rx_lock(rx_mu_, std::try_to_lock);
    if (rx_lock.owns_lock()) {
      rx_holder_.store(std::this_thread::get_id());
      receive_turn(/*block=*/false);
      rx_holder_.store(std::thread::id());
    }
  }
  std::lock_guard<std::mutex> lock(arm_mu_);
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
    if (ctrl_head_ == ctrl_.size() && send_head_ == nullptr) return;
    sender_ = Sender::kActive;
  }
  pump();
}

// ----------------------------------------------------------------- receiving

bool TcpChannel::drive(const std::function<bool()>& ready, Clock::time_point deadline,
                       bool exclusive) {
  const auto horizon =
      std::min(deadline, Clock::now() + std::chrono::microseconds(options_.drive_us));
  flush_deferred(Clock::now(), Clock::duration::zero());  // about to block: no answer coming
  {
    std::lock_guard<std::mutex> lock(arm_mu_);
    if (rx_driving_ || unwatched_ || rx_stopped_.load()) return false;  // sleep instead
    rx_driving_ = true;
    if (!rx_waiter_) {  // else: still leased from the previous wait, nothing to change
      rx_waiter_ = true;
      rearm_locked();  // withdraw EPOLLIN from the progress thread
    }
  }
  driving_.fetch_add(1);
  // An inbox wait can only be satisfied by this socket (or its failure, which
  // shuts the socket down): block in recvmsg itself, one system call per
  // message. A wait on operations may be satisfied by other channels too: poll
  // the socket and this thread's eventfd, which every delivery pokes.
  const int efd = exclusive ? -1 : thread_event_fd();
  if (efd >= 0) loop_->add_waiter(efd);
  bool ok = false;
  for (;;) {
    if (ready()) {
      ok = true;
      break;
    }
    if (rx_stopped_.load()) break;
    auto left = horizon - Clock::now();
    if (left <= Clock::duration::zero()) break;
    if (exclusive) {
      std::lock_guard<std::mutex> rx_lock(rx_mu_);
      rx_holder_.store(std::this_thread::get_id());
      receive_turn(/*block=*/true);
      rx_holder_.store(std::thread::id());
      continue;
    }
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    pollfd fds[2] = {{fd_, POLLIN | POLLRDHUP, 0}, {efd, POLLIN, 0}};
    int r = ::ppoll(fds, efd >= 0 ? 2 : 1, &ts, nullptr);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    if (efd >= 0 && fds[1].revents != 0) {  // a delivery elsewhere: re-check ready()
      uint64_t v;
      [[maybe_unused]] ssize_t n = ::read(efd, &v, sizeof(v));
    }
    if (fds[0].revents != 0) {
      std::lock_guard<std::mutex> rx_lock(rx_mu_);
      rx_holder_.store(std::this_thread::get_id());
      receive_turn(/*block=*/false);
      rx_holder_.store(std::thread::id());
    }
  }
  if (efd >= 0) loop_->remove_waiter(efd);
  {
    std::lock_guard<std::mutex> lock(arm_mu_);
    rx_driving_ = false;
    if (ok && !rx_stopped_.load()) {
      // Keep the socket away from the progress thread for a moment: a thread in
      // a wait loop is back soon, and re-arming costs two epoll_ctl per wait.
      // release_lease() hands it back after 1 ms without a driver.
      lease_since_ = Clock::now();
    } else {
      rx_waiter_ = false;
      rearm_locked();  // level triggered: bytes that arrived meanwhile fire at once
    }
  }
  driving_.fetch_sub(1);
  if (ok) loop_->request_ticks();
  return ok;
}

bool TcpChannel::release_lease(Clock::time_point now, Clock::duration after) {
  std::lock_guard<std::mutex> lock(arm_mu_);
  if (!rx_waiter_ || rx_driving_) return rx_waiter_;
  if (now - lease_since_ < after) return true;
  rx_waiter_ = false;
  rearm_locked();
  return false;
}

uint8_t* TcpChannel::discard_buffer() {
  if (!rx_.discard) rx_.discard = std::make_unique<uint8_t[]>(kDiscardBytes);
  return rx_.discard.get();
}

bool TcpChannel::protocol_error(const std::string& why) {
  fail(RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_,
                      "malformed frame from peer rank " + std::to_string(peer_) + ": " + why));
  return false;
}

void TcpChannel::begin_payload(uint64_t len, uint8_t* target) {
  rx_.in_payload = true;
  rx_.remaining = len;
  rx_.target = target;
  rx_.granted = false;  // on_header marks a write's target
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

bool TcpChannel::enter_target() {
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
  if (rx_.granted) grants_->leave(rx_.gen);
}

// Reads and processes what the socket holds, up to a budget (the caller
// re-arms; level-triggered readiness brings it back if more is waiting).
void TcpChannel::receive_turn(bool block) {
  if (rx_stopped_.load()) return;
  size_t budget = kReceiveBudget;
  for (bool first = true;; first = false) {
    if (!parse_staged()) return;
    // Compose the next read: the rest of the current payload straight into its
    // target, followed by room for the next header (just the header after a
    // bulk payload, so bulk data is never staged).
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
      size_t room = rx_.remaining >= kBulkPayload ? sizeof(FrameHeader) : kStageBytes;
      iov[count++] = {rx_.stage.get(), room};
    } else {
      size_t have = rx_.end - rx_.begin;
      if (rx_.begin > 0) {
        std::memmove(rx_.stage.get(), rx_.stage.get() + rx_.begin, have);
        rx_.begin = 0;
        rx_.end = have;
      }
      size_t room = rx_.exact_header ? sizeof(FrameHeader) - have : kStageBytes - have;
      iov[count++] = {rx_.stage.get() + have, room};
    }
    for (int i = 0; i < count; ++i) want += iov[i].iov_len;
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(count);
    // A driving inbox waiter blocks in its first recvmsg (SO_RCVTIMEO bounds it).
    ssize_t n = ::recvmsg(fd_, &m, block && first ? 0 : MSG_DONTWAIT);
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
      break;
    }
    if (budget == 0) break;
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
    rx_.exact_header = false;
    if (!on_header()) return false;
  }
}

bool TcpChannel::on_header() {
  const FrameHeader& h = rx_.hdr;
  if (h.magic != kFrameMagic) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", h.magic);
    return protocol_error(std::string("bad magic ") + buf);
  }
  auto type = static_cast<FrameType>(h.type);
  rx_.op = nullptr;
  switch (type) {
    case FrameType::kWrite: {
      if (h.length > kMaxChunkPayload) {
        return protocol_error("write chunk of " + std::to_string(h.length) + " bytes");
      }
      if (rx_.has_poisoned && rx_.poisoned_op != h.op_id) rx_.has_poisoned = false;
      uint8_t* dst = nullptr;
      rx_.refusal = Status::ok();
      rx_.gen = grants_->generation();  // before resolving: a revoke after it is seen
      if (!rx_.has_poisoned) {
        if (h.flags & kFlagFirst) {
          // Check the whole write up front so a refused write writes nothing.
          rx_.refusal = grants_->resolve(h.key_id, h.secret, h.offset, h.total, &dst,
                                         "write (remote side)", peer_);
        }
        if (rx_.refusal.is_ok()) {
          rx_.refusal = grants_->resolve(h.key_id, h.secret, h.offset, h.length, &dst,
                                         "write (remote side)", peer_);
        }
      }
      begin_payload(h.length, rx_.refusal.is_ok() && !rx_.has_poisoned ? dst : nullptr);
      rx_.granted = rx_.target != nullptr;
      break;
    }
    case FrameType::kWriteAck:
    case FrameType::kWriteNack:
    case FrameType::kReadNack: {
      uint64_t limit = type == FrameType::kWriteAck ? 0 : kMaxReasonBytes;
      if (h.length > limit) {
        return protocol_error("reply frame with " + std::to_string(h.length) + " payload bytes");
      }
      rx_.bytes.resize(h.length);
      begin_payload(h.length, rx_.bytes.data());
      break;
    }
    case FrameType::kReadRequest: {
      if (h.length != 0 || h.value > kMaxReadRequest) {
        return protocol_error("read request for " + std::to_string(h.value) + " bytes");
      }
      uint8_t* src = nullptr;
      const uint64_t gen = grants_->generation();  // before resolving: a revoke after it is seen
      Status st = grants_->resolve(h.key_id, h.secret, h.offset, h.value, &src,
                                   "read (remote side)", peer_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return false;
        if (st.is_ok()) {
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
      begin_payload(0, nullptr);
      break;
    }
    case FrameType::kReadResponse: {
      if (h.length > kMaxChunkPayload) {
        return protocol_error("read response chunk of " + std::to_string(h.length) + " bytes");
      }
      uint8_t* dst = nullptr;
      bool mismatch = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Op* op = find_op_locked(h.op_id);
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
      if (h.length > kMaxMessageBytes) {
        return protocol_error("message of " + std::to_string(h.length) + " bytes");
      }
      rx_.bytes.resize(h.length);
      begin_payload(h.length, rx_.bytes.data());
      break;
    }
    default:
      return protocol_error("unknown frame type " + std::to_string(h.type));
  }
  if (rx_.remaining == 0) {
    rx_.in_payload = false;
    return on_payload_done();
  }
  return true;
}

bool TcpChannel::on_payload_done() {
  const FrameHeader& h = rx_.hdr;
  rx_.exact_header = h.length >= kBulkPayload;
  auto type = static_cast<FrameType>(h.type);
  const bool last = (h.flags & kFlagLast) != 0;
  DoneList done;
  bool notify = false;
  std::string violation;
  switch (type) {
    case FrameType::kWrite: {
      if (rx_.has_poisoned) {  // an earlier chunk of this write was refused
        if (last) rx_.has_poisoned = false;
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) return false;
      if (!rx_.refusal.is_ok()) {
        FrameHeader nack;
        nack.type = static_cast<uint8_t>(FrameType::kWriteNack);
        nack.op_id = h.op_id;
        nack.code = static_cast<uint16_t>(rx_.refusal.code());
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
        FrameHeader ack;
        ack.type = static_cast<uint8_t>(FrameType::kWriteAck);
        ack.op_id = h.op_id;
        enqueue_ctrl_locked(ack, {});
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
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) return false;
      Op* op = find_op_locked(h.op_id);
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
  // The notify goes to the inbox only now that every byte is in memory; the
  // ACK queued above goes out when the receive turn ends.
  if (notify) inbox_.push_notify(h.value);
  if (notify || type == FrameType::kMessage) rx_delivered_ = true;
  deliver(done, true);
  if (notify || type == FrameType::kMessage) loop_->wake_waiters(thread_event_fd());
  return !rx_stopped_.load();
}

}  // namespace rdmaflow::tcp
