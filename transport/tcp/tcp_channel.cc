// TcpChannel: construction, operation slots and completion delivery (shared by
// both sides), failure, timeouts, close and the socket's readiness events.
// The sender side is in tcp_send.cc, the receiver side in tcp_recv.cc.
#include "transport/tcp/tcp_channel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <boost/asio/post.hpp>

#include "common/log.h"
#include "transport/tcp/tcp_channel_internal.h"

namespace rdmaflow::tcp {

TcpChannel::TcpChannel(std::shared_ptr<IoLoop> loop, std::shared_ptr<GrantTable> grants,
                       std::shared_ptr<LandingTable> landings, int fd, int self_rank, int peer_rank,
                       TcpOptions options)
    : loop_(std::move(loop)),
      grants_(std::move(grants)),
      landings_(std::move(landings)),
      fd_(fd),
      self_(self_rank),
      peer_(peer_rank),
      options_(options) {
  if (options_.chunk_bytes == 0 || options_.chunk_bytes > options_.limits.max_frame) {
    options_.chunk_bytes = std::min<uint64_t>(1 << 20, options_.limits.max_frame);
  }
  rx_.stage = std::make_unique<uint8_t[]>(kStageBytes);
  inbox_.set_peer(peer_);
  bind_counters("tcp", peer_);
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
  enable_zerocopy();
  // ack_now()'s burst, in bytes of this connection's segments (none on the
  // TLS relay's local socket: getsockopt fails there).
  int mss = 0;
  socklen_t len = sizeof(mss);
  if (options_.quickack_segments > 0 &&
      ::getsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) == 0 && mss > 0) {
    quickack_bytes_ = options_.quickack_segments * static_cast<uint64_t>(mss);
  }
  watch_id_ = loop_->watch(fd_, weak_from_this());
  if (options_.drive_us > 0) {
    driver_ = make_channel_driver(weak_from_this(), /*exclusive=*/false);
    inbox_.set_wait_driver(make_channel_driver(weak_from_this(), /*exclusive=*/true));
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

TcpChannel::Op* TcpChannel::new_op_locked(int kind, Callback done, Millis timeout) {
  Op* op = ops_.acquire();
  op->kind = static_cast<Op::Kind>(kind);
  op->peer = peer_;
  op->queued = op->in_batch = op->finish_pending = op->held = false;
  op->done = std::move(done);
  // A read served for the peer has no deadline of its own: the peer times it out.
  if (kind != Op::kServeRead) op->set_deadline(timeout);
  op->header = FrameHeader{};
  op->src = nullptr;
  op->dst = nullptr;
  op->len = op->emitted = op->received = 0;
  op->finish_status = Status::ok();
  op->prev = op->next = nullptr;
  pending_.add(op);
  if (kind != Op::kServeRead) ++pending_user_ops_;
  return op;
}

void TcpChannel::unlink_locked(Op* op) {
  if (!op->queued) return;
  (op->prev ? op->prev->next : send_head_) = op->next;
  (op->next ? op->next->prev : send_tail_) = op->prev;
  op->prev = op->next = nullptr;
  op->queued = false;
  if (op->held) {  // leaving the FIFO: on its way out in a batch, or completed
    op->held = false;
    if (--held_count_ == 0) has_held_.store(false, std::memory_order_relaxed);
  }
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
  if (!pending_.complete(op)) return;
  unlink_locked(op);
  if (op->kind != Op::kServeRead) {
    counters_->add_result(status);
    done.push_back(Done{std::move(op->done), status});
    --pending_user_ops_;
  }
  op->done = nullptr;
  op->in_batch = false;
  if (!op->message.empty()) std::vector<uint8_t>().swap(op->message);
  ops_.release(op);
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
  counters_->add_result(status);
  if (!done) return;
  loop_->post([cb = std::move(done), st = std::move(status), loop = loop_.get()] {
    cb(st);
    loop->wake_waiters();
  });
}

void TcpChannel::close() {
  Status st = RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_, "channel closed");
  close_stripes();
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
  return error_.get();
}

bool TcpChannel::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_ && sender_ != Sender::kActive;
}

void TcpChannel::fail(const Status& error) {
  if (!error_.set(error)) return;  // the first failure is the one reported
  // The stripes fail with the channel: a share still queued in a stripe's
  // socket must not land in memory its owner frees once this channel has
  // failed (the peer closed while this rank was stopped: its stream 0 ends,
  // its other streams still hold shares).
  fail_stripes(error);
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
    pending_.for_each([&](Op& op) {
      if (!(sender_busy && op.in_batch)) complete_locked(&op, error_.for_op(op.name()), done);
    });
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

bool TcpChannel::has_user_ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failed_ && pending_user_ops_ > 0;
}

bool TcpChannel::sweep(Clock::time_point now) {
  DoneList done;
  Status fail_status;
  bool pending;
  {
    // rx_.op may point at an op we complete. A driving waiter holds rx_mu_ (maybe
    // blocked in recvmsg): sweep this channel on a later tick instead of waiting.
    std::unique_lock<std::mutex> rx_lock(rx_mu_, std::try_to_lock);
    if (!rx_lock.owns_lock()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return false;
    settle_sent_locked(done);  // sent posted writes are complete, not overdue
    pending_.sweep(
        now,
        [](const Op& op) -> std::string_view {
          if (op.in_batch) {
            return "being transmitted while the peer does not read; the stream cannot be resumed";
          }
          if (op.queued) return op.emitted > 0 ? "partly sent" : "still queued to send";
          return "sent, no reply from the peer";
        },
        [&](Op& op, Status timeout) {
          if (op.in_batch) {
            // Half way onto the wire: withdrawing it would desynchronize the stream.
            fail_status = std::move(timeout);
            return false;
          }
          if (&op == rx_.op) {  // its response is arriving: drop the rest of the chunk
            rx_.op = nullptr;
            rx_.target = nullptr;
          }
          complete_locked(&op, timeout, done);
          return true;
        });
    pending = pending_user_ops_ > 0;
  }
  deliver(done);
  if (!fail_status.is_ok()) {
    fail(fail_status);
    return false;
  }
  return pending;
}

// ------------------------------------------------------- socket readiness

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
  if (events & EPOLLERR) drain_zerocopy();  // reports pending would keep EPOLLERR up
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

}  // namespace rdmaflow::tcp
