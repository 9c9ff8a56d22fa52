#include "transport/channel.h"

#include <algorithm>

namespace rdmaflow {

void Inbox::push_notify(uint64_t value) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notifies_.push_back(value);
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

void Inbox::push_message(std::vector<uint8_t> bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(std::move(bytes));
  }
  cv_.notify_all();
}

void Inbox::fail(const Status& error) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.is_ok()) return;
    error_ = error;
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

void Inbox::set_notify_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

Result<uint64_t> Inbox::wait_notify(Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  bool ready = cv_.wait_for(lock, timeout, [&] { return !notifies_.empty() || !error_.is_ok(); });
  if (!notifies_.empty()) {
    uint64_t v = notifies_.front();
    notifies_.pop_front();
    return v;
  }
  if (!error_.is_ok()) return error_.with_op("wait for notify");
  (void)ready;
  return RDMAFLOW_ERROR(Code::kTimeout, "wait for notify", peer_,
                        "no notification within " + std::to_string(timeout.count()) + " ms");
}

Status Inbox::wait_notify_value(uint64_t value, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = notifies_.end();
  cv_.wait_for(lock, timeout, [&] {
    it = std::find(notifies_.begin(), notifies_.end(), value);
    return it != notifies_.end() || !error_.is_ok();
  });
  if (it != notifies_.end()) {
    notifies_.erase(it);
    return Status::ok();
  }
  if (!error_.is_ok()) return error_.with_op("wait for notify " + std::to_string(value));
  return RDMAFLOW_ERROR(Code::kTimeout, "wait for notify " + std::to_string(value), peer_,
                        "not notified within " + std::to_string(timeout.count()) + " ms");
}

std::optional<uint64_t> Inbox::poll_notify() {
  std::lock_guard<std::mutex> lock(mu_);
  if (notifies_.empty()) return std::nullopt;
  uint64_t v = notifies_.front();
  notifies_.pop_front();
  return v;
}

Result<std::vector<uint8_t>> Inbox::recv_message(Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !messages_.empty() || !error_.is_ok(); });
  if (!messages_.empty()) {
    auto m = std::move(messages_.front());
    messages_.pop_front();
    return m;
  }
  if (!error_.is_ok()) return error_.with_op("receive message");
  return RDMAFLOW_ERROR(Code::kTimeout, "receive message", peer_,
                        "no message within " + std::to_string(timeout.count()) + " ms");
}

Completion::Completion() : state_(std::make_shared<State>()) {}

Callback Completion::callback() {
  return [s = state_](const Status& st) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->done = true;
      s->status = st;
    }
    s->cv.notify_all();
  };
}

Status Completion::wait(Millis timeout, const std::string& what) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, what, -1,
                          "no completion within " + std::to_string(timeout.count()) + " ms");
  }
  return state_->status;
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Callback CompletionGroup::add() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->pending;
  }
  return [s = state_](const Status& st) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (!st.is_ok() && s->first_error.is_ok()) s->first_error = st;
      --s->pending;
    }
    s->cv.notify_all();
  };
}

Status CompletionGroup::wait(Millis timeout, const std::string& what) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->pending == 0; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, what, -1,
                          std::to_string(state_->pending) + " still pending after " +
                              std::to_string(timeout.count()) + " ms");
  }
  return state_->first_error;
}

}  // namespace rdmaflow
