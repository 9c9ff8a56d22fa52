#include "transport/tcp/tcp_loop.h"

#include "allocator/log.h"

namespace rdmaflow::tcp {

IoLoop::IoLoop(int64_t busy_poll_us) : busy_poll_us_(busy_poll_us) {}

IoLoop::~IoLoop() {
  stop(nullptr);
}

void IoLoop::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ || stopped_) return;
  work_.emplace(io_.get_executor());
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

bool IoLoop::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void IoLoop::run() {
  thread_id_.store(std::this_thread::get_id());
  if (busy_poll_us_ <= 0) {
    io_.run();
    return;
  }
  // Busy polling: spin on poll() (epoll_wait with a zero timeout) while events
  // keep coming, block in run_one() after busy_poll_us_ of silence.
  const auto spin = std::chrono::microseconds(busy_poll_us_);
  auto last = Clock::now();
  while (!io_.stopped()) {
    if (io_.poll() > 0) {
      last = Clock::now();
    } else if (Clock::now() - last > spin) {
      io_.run_one();
      last = Clock::now();
    }
  }
}

void IoLoop::stop(std::function<void()> last) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!running_) {
      lock.unlock();
      if (last) last();
      return;
    }
    if (on_loop_thread()) {
      // Cannot join ourselves; stop the loop and let the owner's destructor wait.
      RDMAFLOW_LOG_ERROR("tcp transport shut down from its own progress thread");
    }
    // Posts that saw running_ == true are queued before this one.
    boost::asio::post(io_, [this, last = std::move(last)] {
      if (last) last();
      timer_.cancel();
      io_.stop();
    });
    running_ = false;
  }
  if (thread_.joinable() && !on_loop_thread()) thread_.join();
  if (thread_.joinable()) thread_.detach();
  work_.reset();
  thread_id_.store(std::thread::id());
}

void IoLoop::set_ticker(std::chrono::milliseconds period,
                        std::function<bool(Clock::time_point)> tick) {
  period_ = period;
  tick_ = std::move(tick);
}

void IoLoop::request_ticks() {
  if (ticking_.load(std::memory_order_relaxed)) return;
  if (!ticking_.exchange(true)) post([this] { arm_tick(); });
}

void IoLoop::arm_tick() {
  if (!running()) return;
  timer_.expires_after(period_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !tick_) return;
    if (tick_(Clock::now())) {
      arm_tick();
      return;
    }
    ticking_.store(false);
    // An operation added between the sweep and the store above must not be missed.
    if (tick_(Clock::now()) && !ticking_.exchange(true)) arm_tick();
  });
}

}  // namespace rdmaflow::tcp
