#include "transport/channel.h"

#include <algorithm>

#include "transport/channel_trace.h"

namespace rdmaflow {
namespace {

// Adds the time from its creation to its destruction to the peer's wait time.
struct WaitClock {
  explicit WaitClock(stats::PeerCounters* c) : counters(c) {}
  ~WaitClock() {
    counters->add_wait_ns(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count()));
  }
  stats::PeerCounters* counters;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

}  // namespace

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
  counters_->add_message_received(bytes.size());
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

void Inbox::set_wait_driver(std::shared_ptr<WaitDriver> driver) {
  std::lock_guard<std::mutex> lock(mu_);
  driver_ = std::move(driver);
}

std::shared_ptr<WaitDriver> Inbox::wait_driver() {
  std::lock_guard<std::mutex> lock(mu_);
  return driver_;
}

template <typename Pred>
void Inbox::drive(std::chrono::steady_clock::time_point deadline, Pred ready) {
  std::shared_ptr<WaitDriver> driver;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ready()) return;
    driver = driver_;
  }
  if (!driver) return;
  driver->drive(
      [&] {
        std::lock_guard<std::mutex> lock(mu_);
        return ready();
      },
      deadline);
}

void Inbox::set_notify_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

Result<uint64_t> Inbox::wait_notify(Millis timeout) {
  const WaitClock waited(counters_);
  const auto deadline = waited.start + timeout;
  auto pred = [&] { return !notifies_.empty() || !error_.is_ok(); };
  drive(deadline, pred);
  std::unique_lock<std::mutex> lock(mu_);
  bool ready = cv_.wait_until(lock, deadline, pred);
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
  const WaitClock waited(counters_);
  const auto deadline = waited.start + timeout;
  drive(deadline, [&] {
    return std::find(notifies_.begin(), notifies_.end(), value) != notifies_.end() ||
           !error_.is_ok();
  });
  std::unique_lock<std::mutex> lock(mu_);
  auto it = notifies_.end();
  cv_.wait_until(lock, deadline, [&] {
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
  std::shared_ptr<WaitDriver> driver;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (notifies_.empty()) driver = driver_;
  }
  if (driver) driver->poll();  // no lock held: it may deliver into this inbox
  std::lock_guard<std::mutex> lock(mu_);
  if (notifies_.empty()) return std::nullopt;
  uint64_t v = notifies_.front();
  notifies_.pop_front();
  return v;
}

Result<std::vector<uint8_t>> Inbox::recv_message(Millis timeout) {
  const WaitClock waited(counters_);
  const auto deadline = waited.start + timeout;
  auto pred = [&] { return !messages_.empty() || !error_.is_ok(); };
  drive(deadline, pred);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, pred);
  if (!messages_.empty()) {
    auto m = std::move(messages_.front());
    messages_.pop_front();
    return m;
  }
  if (!error_.is_ok()) return error_.with_op("receive message");
  return RDMAFLOW_ERROR(Code::kTimeout, "receive message", peer_,
                        "no message within " + std::to_string(timeout.count()) + " ms");
}

Result<DirectView> Channel::direct_view(const RemoteKey& key, uint64_t offset, size_t len,
                                        Millis /*timeout*/) {
  if (!key.covers(offset, len)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, "direct view", peer_rank(),
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(key.length) + " bytes granted");
  }
  return RDMAFLOW_ERROR(Code::kNotViable, "direct view", peer_rank(),
                        "the " + backend() + " backend does not map peer memory");
}

Completion::Completion() : state_(std::make_shared<State>()) {}

void Completion::Signal::operator()(const Status& st) const {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->done = true;
    s->status = st;
  }
  s->cv.notify_all();
}

Callback Completion::callback() {
  return Signal{state_};
}

// Runs `driver` (if attached to `s`) until `ready` holds or `deadline` passes.
template <typename StateT, typename Pred>
static void drive_state(StateT& s, std::chrono::steady_clock::time_point deadline, Pred ready) {
  std::shared_ptr<WaitDriver> driver;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (ready()) return;
    driver = s.driver;
  }
  if (!driver) return;
  driver->drive(
      [&] {
        std::lock_guard<std::mutex> lock(s.mu);
        return ready();
      },
      deadline);
}

Status Completion::wait(Millis timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  drive_state(*state_, deadline, [&] { return state_->done; });
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
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
  return Signal{state_};
}

void CompletionGroup::Signal::operator()(const Status& st) const {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (!st.is_ok() && s->first_error.is_ok()) s->first_error = st;
    --s->pending;
  }
  s->cv.notify_all();
}

Status CompletionGroup::wait(Millis timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  drive_state(*state_, deadline, [&] { return state_->pending == 0; });
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->pending == 0; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, what, -1,
                          std::to_string(state_->pending) + " still pending after " +
                              std::to_string(timeout.count()) + " ms");
  }
  return state_->first_error;
}

void attach_wait_driver(const Callback& done, const std::shared_ptr<WaitDriver>& driver) {
  if (!driver) return;
  if (const auto* t = done.target<TracedOp>()) return attach_wait_driver(t->inner, driver);
  if (const auto* c = done.target<Completion::Signal>()) {
    std::lock_guard<std::mutex> lock(c->s->mu);
    c->s->driver = driver;
  } else if (const auto* g = done.target<CompletionGroup::Signal>()) {
    std::lock_guard<std::mutex> lock(g->s->mu);
    if (!g->s->driver) g->s->driver = driver;  // a group spanning backends drives the first
  }
}

}  // namespace rdmaflow
