// The progress engine of one TCP transport: an io_context run by one thread.
//
// Thread model: socket events, timeouts and failure handling run on this
// thread, and so do completion callbacks, except while a waiting user thread
// drives a channel itself (TcpChannel::drive). User threads otherwise only
// enqueue work (and may send inline, see tcp_channel.h). `post` runs a
// function on the loop, or inline once the loop has stopped, so work handed
// over is never lost.
//
// Channel sockets are not registered with Asio's reactor: they live in a
// private epoll set (level-triggered, one-shot) whose descriptor the loop
// waits on through Asio. That lets a channel withdraw its socket from the
// progress thread while a waiter receives on it, so the progress thread is not
// woken for bytes somebody else reads.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rdmaflow::tcp {

using Clock = std::chrono::steady_clock;

// Something with a descriptor in the loop's epoll set.
class FdWatcher {
 public:
  virtual ~FdWatcher() = default;
  // Progress thread: the descriptor fired with `events` (EPOLLIN, EPOLLOUT, ...)
  // and is disarmed until arm() is called again.
  virtual void on_fd_event(uint32_t events) = 0;
};

class IoLoop {
 public:
  // busy_poll_us > 0: after each event the thread keeps polling for that long
  // before it blocks in epoll again (RDMAFLOW_TCP_BUSY_POLL).
  explicit IoLoop(int64_t busy_poll_us);
  ~IoLoop();

  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;

  boost::asio::io_context& io() { return io_; }
  void start();

  template <typename F>
  void post(F&& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    if (running_) {
      boost::asio::post(io_, std::forward<F>(fn));
      return;
    }
    lock.unlock();
    fn();
  }

  bool on_loop_thread() const { return std::this_thread::get_id() == thread_id_.load(); }
  bool running() const;

  // Runs `last` on the loop, then stops and joins the thread. Later posts run
  // inline. Idempotent. Must not be called from the loop thread.
  void stop(std::function<void()> last);

  // Timeout sweeping: `tick` runs on the loop every `period` while it returns
  // true; request_ticks() restarts it after it returned false.
  void set_ticker(std::chrono::milliseconds period, std::function<bool(Clock::time_point)> tick);
  void request_ticks();

  // ---- the epoll set (any thread) ----
  // Adds `fd`, disarmed; returns its id for arm()/unwatch().
  uint64_t watch(int fd, std::weak_ptr<FdWatcher> watcher);
  // One-shot interest in `events` (0 = none). Level triggered: arming a
  // descriptor that is already ready fires at once.
  void arm(int fd, uint64_t id, uint32_t events);
  void unwatch(int fd, uint64_t id);

  // ---- waiters blocked in poll() (TcpChannel::drive) ----
  // A waiter polls its own eventfd; wake_waiters() (after any delivery) pokes
  // every registered one, so a wait spanning several channels is not missed.
  void add_waiter(int event_fd);
  void remove_waiter(int event_fd);
  // `except_fd`: the caller's own eventfd (a driving waiter needs no poke).
  void wake_waiters(int except_fd = -1);

 private:
  void run();
  void arm_tick();
  void wait_events();
  void dispatch_events();

  boost::asio::io_context io_{1};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  mutable std::mutex mu_;
  bool running_ = false;
  bool stopped_ = false;
  int64_t busy_poll_us_;

  boost::asio::steady_timer timer_{io_};
  std::chrono::milliseconds period_{10};
  std::function<bool(Clock::time_point)> tick_;
  std::atomic<bool> ticking_{false};
  static constexpr int kIdleTicks = 100;  // 100 ms at tcp's 1 ms
  int idle_ticks_ = 0;                    // loop thread

  int epoll_fd_ = -1;
  boost::asio::posix::stream_descriptor epoll_desc_{io_};
  std::mutex watch_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<FdWatcher>> watchers_;
  uint64_t next_watch_id_ = 1;

  std::mutex waiters_mu_;
  std::vector<int> waiter_fds_;
  std::atomic<int> waiter_count_{0};
};

}  // namespace rdmaflow::tcp
