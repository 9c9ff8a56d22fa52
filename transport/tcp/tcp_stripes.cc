// TcpChannel, striping (RDMAFLOW_TCP_STREAMS > 1): a large write is split over
// this channel's socket and its stripes (the other connections to the same
// peer), which the kernel moves in parallel. Its notify rides on stream 0 as a
// zero-length write issued only after every share was acknowledged, i.e. is in
// the peer's memory, so the contract (a notify is seen only after every byte of
// its write) holds across sockets. Operations issued behind a striped write
// wait for it, so the peer sees stream 0's frames in issue order as with one
// socket.
#include <algorithm>
#include <utility>

#include "transport/channel_trace.h"
#include "transport/tcp/tcp_channel.h"

namespace rdmaflow::tcp {

namespace {

constexpr uint64_t kShareAlign = 4096;  // shares start on page boundaries

}  // namespace

void TcpChannel::set_stripes(std::vector<std::shared_ptr<TcpChannel>> stripes,
                             std::vector<std::shared_ptr<Channel>> handles) {
  std::lock_guard<std::mutex> lock(stripe_mu_);
  stripes_ = std::move(stripes);
  stripe_handles_ = std::move(handles);
  striped_.store(!stripes_.empty(), std::memory_order_relaxed);
}

bool TcpChannel::route(bool big, std::function<void()>& issue) {
  std::unique_lock<std::mutex> lock(stripe_mu_);
  if (stripes_.empty()) return false;
  if (striping_) {
    held_.push_back({std::move(issue), big});
    return true;
  }
  if (!big) return false;
  striping_ = true;
  lock.unlock();
  issue();
  return true;
}

void TcpChannel::write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                       std::optional<uint64_t> notify, Callback done, Millis timeout) {
  write_routed(src, len, dst, dst_offset, notify, std::move(done), timeout, /*no_ack=*/false);
}

void TcpChannel::post_write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                            std::optional<uint64_t> notify, Callback done, Millis timeout) {
  write_routed(src, len, dst, dst_offset, notify, std::move(done), timeout, /*no_ack=*/true);
}

void TcpChannel::post_write_deferred(const void* src, size_t len, const RemoteKey& dst,
                                     uint64_t dst_offset, std::optional<uint64_t> notify,
                                     Callback done, Millis timeout, int hold) {
  write_routed(src, len, dst, dst_offset, notify, std::move(done), timeout, /*no_ack=*/true,
               std::max(hold, 0));
}

void TcpChannel::write_routed(const void* src, size_t len, const RemoteKey& dst,
                              uint64_t dst_offset, std::optional<uint64_t> notify, Callback done,
                              Millis timeout, bool no_ack, int hold) {
  trace_op(done, "write", *this, len);
  counters_->add_write(len);
  if (!striped_.load(std::memory_order_relaxed)) {  // one stream: nothing to order against
    return write_now(src, len, dst, dst_offset, notify, std::move(done), timeout, nullptr, no_ack,
                     hold);
  }
  const bool big = len >= options_.stripe_min;
  std::function<void()> issue = [this, src, len, dst, dst_offset, notify, done, timeout, big,
                                 no_ack, hold] {
    if (big) {
      write_striped(src, len, dst, dst_offset, notify, done, timeout);
    } else {
      write_now(src, len, dst, dst_offset, notify, done, timeout, nullptr, no_ack, hold);
    }
  };
  if (route(big, issue)) return;
  write_now(src, len, dst, dst_offset, notify, std::move(done), timeout, nullptr, no_ack, hold);
}

void TcpChannel::read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset,
                      Callback done, Millis timeout) {
  trace_op(done, "read", *this, len);
  counters_->add_read(len);
  if (!striped_.load(std::memory_order_relaxed)) {
    return read_now(dst, len, src, src_offset, std::move(done), timeout);
  }
  std::function<void()> issue = [this, dst, len, src, src_offset, done, timeout] {
    read_now(dst, len, src, src_offset, done, timeout);
  };
  if (route(false, issue)) return;
  read_now(dst, len, src, src_offset, std::move(done), timeout);
}

void TcpChannel::send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) {
  trace_op(done, "message", *this, bytes.size());
  counters_->add_message_sent(bytes.size());
  // Copied into the closure only when held (rare), moved otherwise.
  if (striped_.load(std::memory_order_relaxed)) {
    std::unique_lock<std::mutex> lock(stripe_mu_);
    if (striping_) {
      auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
      held_.push_back(
          {[this, shared, done, timeout] { send_message_now(std::move(*shared), done, timeout); },
           false});
      return;
    }
  }
  send_message_now(std::move(bytes), std::move(done), timeout);
}

void TcpChannel::write_striped(const void* src, size_t len, const RemoteKey& dst,
                               uint64_t dst_offset, std::optional<uint64_t> notify, Callback done,
                               Millis timeout) {
  auto self = shared_from_this();
  if (Status st = check_key(dst, dst_offset, len, "write"); !st.is_ok() || src == nullptr) {
    // The single-socket path refuses it with the same status, and lets the held ones go.
    write_now(src, len, dst, dst_offset, notify, std::move(done), timeout);
    issue_held();
    return;
  }
  std::vector<std::shared_ptr<TcpChannel>> stripes;
  {
    std::lock_guard<std::mutex> lock(stripe_mu_);
    stripes = stripes_;
  }
  if (stripes.empty()) {  // closed meanwhile: the single-socket path reports it
    write_now(src, len, dst, dst_offset, notify, std::move(done), timeout);
    issue_held();
    return;
  }
  const uint64_t n = stripes.size() + 1;
  const uint64_t share = (len / n + kShareAlign - 1) / kShareAlign * kShareAlign;
  struct Join {
    std::mutex mu;
    int left = 0;
    Status status = Status::ok();
  };
  auto join = std::make_shared<Join>();
  std::vector<std::pair<uint64_t, uint64_t>> parts;  // [from, to) of each stream's share
  for (uint64_t i = 0, from = 0; i < n && from < len; ++i) {
    const uint64_t to = i + 1 == n ? len : std::min<uint64_t>(len, from + share);
    parts.emplace_back(from, to);
    from = to;
  }
  join->left = static_cast<int>(parts.size());
  auto finish = [self, join, src, dst, dst_offset, notify, done, timeout](const Status& st) {
    {
      std::lock_guard<std::mutex> lock(join->mu);
      if (!st.is_ok() && join->status.is_ok()) join->status = st;
      if (--join->left > 0) return;
    }
    if (!join->status.is_ok()) {
      done(join->status);
    } else if (notify) {
      // Every share is in the peer's memory: now the notify, in stream 0's order.
      self->write_now(src, 0, dst, dst_offset, notify, done, timeout);
    } else {
      done(Status::ok());
    }
    self->issue_held();
  };
  // Each share checks the whole write at the target, so a refused write writes nothing.
  const Share whole{dst_offset, len};
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [from, to] = parts[i];
    const auto* p = static_cast<const uint8_t*>(src) + from;
    TcpChannel& ch = i == 0 ? *this : *stripes[i - 1];
    ch.write_now(p, to - from, dst, dst_offset + from, std::nullopt, finish, timeout, &whole);
  }
}

void TcpChannel::issue_held() {
  for (;;) {
    Held h;
    {
      std::lock_guard<std::mutex> lock(stripe_mu_);
      if (held_.empty()) {
        striping_ = false;
        return;
      }
      h = std::move(held_.front());
      held_.pop_front();
    }
    h.issue();
    if (h.striped) return;  // its completion issues the rest
  }
}

void TcpChannel::close_stripes() {
  std::vector<std::shared_ptr<Channel>> handles;
  {
    std::lock_guard<std::mutex> lock(stripe_mu_);
    handles.swap(stripe_handles_);
    stripes_.clear();
  }
  for (auto& h : handles) h->close();
}

void TcpChannel::fail_stripes(const Status& error) {
  std::vector<std::shared_ptr<TcpChannel>> stripes;
  std::vector<std::shared_ptr<Channel>> handles;
  {
    std::lock_guard<std::mutex> lock(stripe_mu_);
    stripes.swap(stripes_);
    handles.swap(stripe_handles_);
  }
  // With the channel's own error, so that a striped write reports the peer's
  // failure, not a cancellation; then the handles close them (a no-op now).
  for (auto& s : stripes) s->fail(error);
  handles.clear();
}

}  // namespace rdmaflow::tcp
