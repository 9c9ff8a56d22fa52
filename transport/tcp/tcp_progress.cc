#include "transport/tcp/tcp_progress.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace rdmaflow::tcp {

IoLoop::IoLoop(int64_t busy_poll_us) : busy_poll_us_(busy_poll_us) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    RDMAFLOW_LOG_ERROR("tcp: epoll_create1 failed: {}", std::strerror(errno));
    return;
  }
  boost::system::error_code ec;
  epoll_desc_.assign(epoll_fd_, ec);  // owns and closes it
  if (ec) RDMAFLOW_LOG_ERROR("tcp: cannot watch the epoll set: {}", ec.message());
}

IoLoop::~IoLoop() {
  stop(nullptr);
}

void IoLoop::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ || stopped_) return;
    work_.emplace(io_.get_executor());
    running_ = true;
  }
  boost::asio::post(io_, [this] { wait_events(); });
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
      RDMAFLOW_LOG_ERROR("tcp transport shut down from its own progress thread");
    }
    // Posts that saw running_ == true are queued before this one.
    boost::asio::post(io_, [this, last = std::move(last)] {
      if (last) last();
      timer_.cancel();
      boost::system::error_code ignored;
      epoll_desc_.cancel(ignored);
      io_.stop();
    });
    running_ = false;
  }
  if (thread_.joinable() && !on_loop_thread()) thread_.join();
  if (thread_.joinable()) thread_.detach();
  work_.reset();
  thread_id_.store(std::thread::id());
}

// ------------------------------------------------------------------- ticks

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
    // Keep ticking for a while after the last pending operation: restarting the
    // ticker costs a wake-up of this thread, which a busy channel would pay per
    // operation.
    if (tick_(Clock::now())) {
      idle_ticks_ = 0;
      arm_tick();
      return;
    }
    if (++idle_ticks_ < kIdleTicks) {
      arm_tick();
      return;
    }
    idle_ticks_ = 0;
    ticking_.store(false);
    // An operation added between the sweep and the store above must not be missed.
    if (tick_(Clock::now()) && !ticking_.exchange(true)) arm_tick();
  });
}

// --------------------------------------------------------------- epoll set

uint64_t IoLoop::watch(int fd, std::weak_ptr<FdWatcher> watcher) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    id = next_watch_id_++;
    watchers_.emplace(id, std::move(watcher));
  }
  epoll_event ev{};
  ev.events = EPOLLONESHOT;  // disarmed until arm()
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    RDMAFLOW_LOG_ERROR("tcp: epoll_ctl(ADD) failed: {}", std::strerror(errno));
  }
  return id;
}

void IoLoop::arm(int fd, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events | EPOLLONESHOT;
  ev.data.u64 = id;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);  // fails harmlessly once unwatched
}

void IoLoop::unwatch(int fd, uint64_t id) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  std::lock_guard<std::mutex> lock(watch_mu_);
  watchers_.erase(id);
}

void IoLoop::wait_events() {
  if (!epoll_desc_.is_open()) return;
  epoll_desc_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         [this](const boost::system::error_code& ec) {
                           if (ec) return;
                           dispatch_events();
                           wait_events();
                         });
}

void IoLoop::dispatch_events() {
  constexpr int kMax = 64;
  epoll_event events[kMax];
  for (;;) {
    int n = ::epoll_wait(epoll_fd_, events, kMax, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      std::shared_ptr<FdWatcher> w;
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        auto it = watchers_.find(events[i].data.u64);
        if (it != watchers_.end()) w = it->second.lock();
      }
      if (w) w->on_fd_event(events[i].events);
    }
    if (n < kMax) return;  // the set is edge-watched by Asio: drain it fully
  }
}

// ----------------------------------------------------------------- waiters

void IoLoop::add_waiter(int event_fd) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  waiter_fds_.push_back(event_fd);
  waiter_count_.fetch_add(1);
}

void IoLoop::remove_waiter(int event_fd) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  auto it = std::find(waiter_fds_.begin(), waiter_fds_.end(), event_fd);
  if (it != waiter_fds_.end()) {
    waiter_fds_.erase(it);
    waiter_count_.fetch_sub(1);
  }
}

void IoLoop::wake_waiters(int except_fd) {
  if (waiter_count_.load() == 0) return;
  std::lock_guard<std::mutex> lock(waiters_mu_);
  for (int fd : waiter_fds_) {
    if (fd == except_fd) continue;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
  }
}

}  // namespace rdmaflow::tcp
