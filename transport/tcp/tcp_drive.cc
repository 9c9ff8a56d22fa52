// TcpChannel, driven by its waiters: a thread blocked in a wait takes the
// socket from the progress thread and runs the receive path itself (see the
// thread model in tcp_channel.h). ChannelDriver drives one channel;
// GroupDriver (WaitDriver::join) drives several at once, for a waiter that
// any of them may satisfy: one ppoll over all their sockets, so the answer
// on whichever channel wakes the waiting thread itself.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <boost/container/small_vector.hpp>

#include "transport/shm/wake_socket.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_channel_internal.h"

namespace rdmaflow::tcp {

namespace {

using Channels = boost::container::small_vector<std::shared_ptr<TcpChannel>, 8>;

timespec until(Clock::duration left) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// StepGather: this thread's nesting and the channels holding its writes.
struct Gathered {
  int depth = 0;
  boost::container::small_vector<std::shared_ptr<TcpChannel>, 4> channels;
};
Gathered& gathered() {
  thread_local Gathered g;
  return g;
}

// A waiter's ready() (the executor's step), with its hold-0 writes gathered.
bool gathered_ready(const std::function<bool()>& ready) {
  const StepGather gather;
  return ready();
}

// How long a poller (GroupDriver::poll) holds an ACK back for its answer.
constexpr auto kPollAckDelay = std::chrono::microseconds(50);

void clear_event_fd(int efd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(efd, &v, sizeof(v));
}

// Drives every channel of one transport that a wait depends on. A channel
// another waiter drives is left to it (its deliveries poke this thread's
// eventfd); one that fails ends the drive (the waiter looks at its error).
class GroupDriver final : public WaitDriver {
 public:
  GroupDriver(std::vector<std::weak_ptr<TcpChannel>> channels, std::shared_ptr<IoLoop> loop)
      : channels_(std::move(channels)), loop_(std::move(loop)) {}

  bool drive(const std::function<bool()>& ready, Clock::time_point deadline) override {
    return drive_watching(ready, deadline, -1);
  }

  // The fabric's mixed wait: the same ppoll also watches the wake socket of
  // same-host peers (collectives/fabric.h mixed_driver()).
  bool watches_fds() const override { return true; }
  bool drive_watching(const std::function<bool()>& ready, Clock::time_point deadline,
                      int wake_fd) override {
    Channels driven;
    if (!begin_drives(driven)) return false;
    const int efd = thread_event_fd();
    loop_->add_waiter(efd);
    boost::container::small_vector<pollfd, 10> fds;
    const size_t n = driven.size();
    bool ok = false;
    for (;;) {
      if (gathered_ready(ready)) {
        ok = true;
        break;
      }
      if (std::any_of(driven.begin(), driven.end(), [](auto& ch) { return !ch->receiving(); })) {
        break;
      }
      // About to block: ACKs held back for an answer that did not come go now,
      // and posted writes that left complete (which may satisfy the wait).
      for (auto& ch : driven) ch->flush_deferred(Clock::now(), Clock::duration::zero());
      bool settled = false;
      for (auto& ch : driven) settled = ch->settle_posted() || settled;
      if (settled) continue;
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) break;
      fds.clear();
      for (auto& ch : driven) fds.push_back({ch->fd(), POLLIN | POLLRDHUP, 0});
      fds.push_back({efd, POLLIN, 0});
      if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
      const timespec ts = until(left);
      int r = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
      if (r < 0 && errno != EINTR) break;
      if (r <= 0) continue;
      if (fds[n].revents != 0) clear_event_fd(efd);  // a delivery elsewhere
      // A same-host peer rang: drained, ready() looks next.
      if (wake_fd >= 0 && fds[n + 1].revents != 0) shm::drain_wake_fd(wake_fd);
      for (size_t i = 0; i < n; ++i) {
        if (fds[i].revents != 0) driven[i]->drive_turn(fds[i].revents);
      }
    }
    loop_->remove_waiter(efd);
    for (auto& ch : driven) ch->end_drive(ok);
    if (ok && !driven.empty()) loop_->request_ticks();
    return ok;
  }

  // One look at every socket, without blocking: for a waiter that spins the
  // way Open MPI's ranks do (poll, yield the core, poll again) rather than
  // sleeping. A sleeper in ppoll costs each frame a wake-up of its own (on 4
  // ranks crowded onto 2 cores, the waking softirq and the switch back in
  // were a quarter of a rank's CPU time); a poller is on no wait queue, so
  // the frame's sender only queues the bytes. The sockets stay leased to
  // this thread between polls, as after a satisfied drive.
  void poll() override {
    Channels driven;
    if (!begin_drives(driven) || driven.empty()) return;
    boost::container::small_vector<pollfd, 8> fds;
    for (auto& ch : driven) fds.push_back({ch->fd(), POLLIN | POLLRDHUP, 0});
    const timespec zero{0, 0};
    if (::ppoll(fds.data(), fds.size(), &zero, nullptr) > 0) {
      for (size_t i = 0; i < driven.size(); ++i) {
        if (fds[i].revents != 0) driven[i]->drive_turn(fds[i].revents);
      }
    }
    // ACKs held back for an answer go once they waited a poll slice (a
    // sleeping drive sends them at once, a poller is about to answer); posted
    // writes that left complete (their completion may be what it waits for).
    const auto now = Clock::now();
    for (auto& ch : driven) {
      ch->flush_deferred(now, kPollAckDelay);
      ch->settle_posted();
    }
    for (auto& ch : driven) ch->end_drive(/*ok=*/true);
    loop_->request_ticks();
  }

  // The poller sleeps elsewhere next (a doorbell): the progress thread reads
  // the sockets poll() leased from now on, not after the lease's 1 ms.
  void release() override {
    const auto now = Clock::now();
    for (const auto& weak : channels_) {
      if (auto ch = weak.lock()) ch->release_lease(now, Clock::duration::zero());
    }
  }

 private:
  // Takes from the progress thread every channel no other waiter drives;
  // false (taking none) when one is gone or stopped receiving, which ends
  // the wait (the waiter looks at its error). Checked before any is taken,
  // so an early return leaves no channel marked as driven.
  bool begin_drives(Channels& driven) {
    Channels all;
    for (const auto& weak : channels_) {
      auto ch = weak.lock();
      if (!ch || !ch->receiving()) return false;
      all.push_back(std::move(ch));
    }
    for (auto& ch : all) {
      if (ch->begin_drive()) driven.push_back(std::move(ch));
    }
    return true;
  }

  std::vector<std::weak_ptr<TcpChannel>> channels_;
  std::shared_ptr<IoLoop> loop_;
};

class ChannelDriver final : public WaitDriver {
 public:
  ChannelDriver(std::weak_ptr<TcpChannel> ch, bool exclusive)
      : ch_(std::move(ch)), exclusive_(exclusive) {}

  bool drive(const std::function<bool()>& ready, Clock::time_point deadline) override {
    auto ch = ch_.lock();
    return ch ? ch->drive(ready, deadline, exclusive_) : false;
  }

  // Channels of the same transport (one progress loop) join; anything else
  // (another backend, another transport's tcp) does not.
  std::shared_ptr<WaitDriver> join(
      const std::vector<std::shared_ptr<WaitDriver>>& drivers) override {
    std::vector<std::weak_ptr<TcpChannel>> channels;
    std::shared_ptr<IoLoop> loop;
    for (const auto& d : drivers) {
      auto* mine = dynamic_cast<ChannelDriver*>(d.get());
      if (mine == nullptr) return nullptr;
      auto ch = mine->ch_.lock();
      if (!ch || (loop && ch->loop() != loop)) return nullptr;
      loop = ch->loop();
      channels.push_back(ch);
    }
    if (channels.empty()) return nullptr;
    return std::make_shared<GroupDriver>(std::move(channels), std::move(loop));
  }

 private:
  std::weak_ptr<TcpChannel> ch_;
  bool exclusive_;
};

}  // namespace

StepGather::StepGather() {
  ++gathered().depth;
}

StepGather::~StepGather() {
  Gathered& g = gathered();
  if (--g.depth > 0) return;
  // Taken out first: sending may run callbacks that step again.
  auto channels = std::move(g.channels);
  g.channels.clear();
  for (auto& ch : channels) ch->send_held();
}

bool StepGather::active() {
  return gathered().depth > 0;
}

void StepGather::add(std::shared_ptr<TcpChannel> channel) {
  auto& channels = gathered().channels;
  if (std::find(channels.begin(), channels.end(), channel) == channels.end()) {
    channels.push_back(std::move(channel));
  }
}

std::shared_ptr<WaitDriver> make_channel_driver(std::weak_ptr<TcpChannel> channel, bool exclusive) {
  return std::make_shared<ChannelDriver>(std::move(channel), exclusive);
}

bool TcpChannel::begin_drive() {
  std::lock_guard<std::mutex> lock(arm_mu_);
  if (rx_driving_ || unwatched_ || rx_stopped_.load()) return false;
  rx_driving_ = true;
  if (!rx_waiter_) {  // else: still leased from the previous wait, nothing to change
    rx_waiter_ = true;
    rearm_locked();  // withdraw EPOLLIN from the progress thread
  }
  driving_.fetch_add(1);
  return true;
}

void TcpChannel::drive_turn(short revents) {
  if (revents & POLLERR) drain_zerocopy();  // else POLLERR stays up: a busy loop
  std::lock_guard<std::mutex> rx_lock(rx_mu_);
  rx_holder_.store(std::this_thread::get_id());
  receive_turn(/*block=*/false);
  rx_holder_.store(std::thread::id());
}

void TcpChannel::end_drive(bool ok) {
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
}

bool TcpChannel::drive(const std::function<bool()>& ready, Clock::time_point deadline,
                       bool exclusive) {
  const auto horizon =
      std::min(deadline, Clock::now() + std::chrono::microseconds(options_.drive_us));
  if (!begin_drive()) {
    flush_deferred(Clock::now(), Clock::duration::zero());  // about to sleep: no answer coming
    return false;
  }
  // An inbox wait can only be satisfied by this socket (or its failure, which
  // shuts the socket down): block in recvmsg itself, one system call per
  // message. A wait on operations may be satisfied by other channels too: poll
  // the socket and this thread's eventfd, which every delivery pokes.
  const int efd = exclusive ? -1 : thread_event_fd();
  if (efd >= 0) loop_->add_waiter(efd);
  bool ok = false;
  for (;;) {
    if (gathered_ready(ready)) {
      ok = true;
      break;
    }
    if (rx_stopped_.load()) break;
    // About to block. Deferred ACKs go out now, not at the start of the drive:
    // ready() may have posted the answer they were waiting to ride along with
    // (an executor's next piece), which took them already.
    flush_deferred(Clock::now(), Clock::duration::zero());
    if (settle_posted()) continue;  // posted writes that left: their completion may satisfy us
    auto left = horizon - Clock::now();
    if (left <= Clock::duration::zero()) break;
    if (exclusive) {
      std::lock_guard<std::mutex> rx_lock(rx_mu_);
      rx_holder_.store(std::this_thread::get_id());
      receive_turn(/*block=*/true);
      rx_holder_.store(std::thread::id());
      continue;
    }
    const timespec ts = until(left);
    pollfd fds[2] = {{fd_, POLLIN | POLLRDHUP, 0}, {efd, POLLIN, 0}};
    int r = ::ppoll(fds, efd >= 0 ? 2 : 1, &ts, nullptr);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    if (efd >= 0 && fds[1].revents != 0) clear_event_fd(efd);  // a delivery elsewhere
    if (fds[0].revents != 0) drive_turn(fds[0].revents);
  }
  if (efd >= 0) loop_->remove_waiter(efd);
  end_drive(ok);
  if (ok) loop_->request_ticks();
  return ok;
}

bool TcpChannel::settle_posted() {
  if (!has_sent_no_ack_.load(std::memory_order_relaxed)) return false;
  DoneList done;
  std::lock_guard<std::mutex> rx_lock(rx_mu_);
  rx_holder_.store(std::this_thread::get_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    settle_sent_locked(done);
  }
  const bool any = !done.empty();
  deliver(done, /*receive_path=*/true);
  rx_holder_.store(std::thread::id());
  return any;
}

bool TcpChannel::release_lease(Clock::time_point now, Clock::duration after) {
  std::lock_guard<std::mutex> lock(arm_mu_);
  if (!rx_waiter_ || rx_driving_) return rx_waiter_;
  if (now - lease_since_ < after) return true;
  rx_waiter_ = false;
  rearm_locked();
  return false;
}

}  // namespace rdmaflow::tcp
