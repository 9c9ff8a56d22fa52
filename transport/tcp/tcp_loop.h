// The progress engine of one TCP transport: an io_context run by one thread.
//
// Thread model: every socket read, every timeout and every completion callback
// runs on this thread. User threads only enqueue work (and may send inline, see
// tcp_channel.h). `post` runs a function on the loop, or inline once the loop
// has stopped, so work handed over is never lost.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace rdmaflow::tcp {

using Clock = std::chrono::steady_clock;

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

 private:
  void run();
  void arm_tick();

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
};

}  // namespace rdmaflow::tcp
