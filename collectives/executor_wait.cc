#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "collectives/executor_run.h"
#include "transport/shm/memory_channel.h"

namespace rdmaflow::executor_detail {
namespace {

// Longest stretch of driving before the executor re-checks deadline and peers.
constexpr auto kSlice = std::chrono::microseconds(20);
// The same while it sleeps inside the backend's driver.
constexpr auto kRecheck = std::chrono::milliseconds(100);
// ... or on the doorbell (direct peers).
constexpr auto kDirectRecheck = std::chrono::milliseconds(20);
// Longest poll of the words before a mixed wait blocks (run_mixed).
constexpr auto kMixedSpin = std::chrono::microseconds(50);
// How often a waiting executor looks at the channels of the peers it is not
// waiting on.
constexpr auto kPeerScan = std::chrono::milliseconds(5);
// A polling slice (RDMAFLOW_COLL_POLL_US) whose thread was off the CPU this
// much longer than it ran lost a time slice to other work (a wake-up of a
// progress thread on the same core costs microseconds), and the thread
// sleeps in its waits for kPollBackoff instead.
constexpr auto kPreempted = std::chrono::microseconds(200);
constexpr auto kPollBackoff = std::chrono::milliseconds(50);

// CPU time this thread ran.
Clock::duration thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

std::string item_text(const Item& it, uint64_t seq) {
  std::string s = it.kind == ItemKind::kSend ? "sending" : "receiving";
  s += " piece " + std::to_string(seq) + " of step " + std::to_string(it.step) +
       (it.kind == ItemKind::kSend ? " to" : " from") + " rank " + std::to_string(it.peer);
  return s;
}

}  // namespace

// ---- wait ----

// Nothing can move: fails the call when a peer failed, the communicator was
// aborted or the deadline passed (true); else names what we wait for. The
// deadline is about progress, not total time: every finished piece moves it
// to `patience_` from now, so a large collective on a slow link runs as long
// as its bytes keep moving, and a stalled one fails `patience_` after its
// last piece.
bool Run::blocked(Clock::time_point now) {
  if (finished_ != finished_seen_) {
    finished_seen_ = finished_;
    deadline_ = std::max(deadline_, now + patience_);
  }
  // The first ready item with a peer is what we wait for; its text is only
  // made for a timeout (this runs at every wake-up). A failed peer is found
  // by the scan below, within kPeerScan.
  waiting_peer_ = -1;
  waiting_item_ = -1;
  for (uint32_t i : scratch_.ready) {
    if (items_[i].peer < 0) continue;
    waiting_peer_ = items_[i].peer;
    waiting_item_ = static_cast<int64_t>(i);
    break;
  }
  failure_ = fabric_.detached_error();
  if (!failure_.is_ok()) return true;
  failure_ = fabric_.aborted();
  if (!failure_.is_ok()) return true;
  // Every rank takes part in every collective, so a peer whose channel
  // failed (a dead rank's sockets close) dooms this call even when this
  // rank's part of the schedule never talks to it: fail now, naming it,
  // rather than time out waiting on a neighbour that waits on it.
  if (now >= next_peer_scan_) {
    next_peer_scan_ = now + kPeerScan;
    for (int p = 0; p < world_; ++p) {
      Status st = fabric_.peer_error(p);
      if (!st.is_ok()) {
        failure_ = std::move(st);
        return true;
      }
    }
  }
  for (int p = 0; p < world_ && waiting_peer_ < 0; ++p) {
    if (scratch_.inflight[p] > 0) waiting_peer_ = p;
  }
  if (now >= deadline_) {
    failure_ = timeout_error();
    return true;
  }
  return false;
}

// What blocked() found us waiting for.
std::string Run::waiting_text() const {
  if (waiting_item_ < 0) return "write completions";
  const Item& it = items_[static_cast<size_t>(waiting_item_)];
  const uint64_t seq =
      (it.kind == ItemKind::kSend ? scratch_.send_base : scratch_.recv_base)[it.peer] + it.ordinal;
  std::string text = item_text(it, seq);
  if (it.kind == ItemKind::kSend) text += " (waiting for its slot to be freed)";
  return text;
}

Status Run::timeout_error() const {
  return RDMAFLOW_ERROR(Code::kTimeout, what_, waiting_peer_,
                        "no progress before the deadline while " + waiting_text() + " (" +
                            std::to_string(finished_) + " of " + std::to_string(n_) +
                            " pieces done)");
}

// Same-host direct peers signal pieces and credits straight into our
// memory: poll (the loads are the whole cost) until `cfg.direct_spin` passed
// without progress, then sleep on the memory endpoint's doorbell, which they
// ring (and so do local completions, for peers on the notify path). The
// sleep is cut into kDirectRecheck slices to notice a dead peer.
//
// A crowded rank with peers on other hosts too (Fabric::mixed_poll_driver)
// also polls their sockets at every look, without blocking, and reads what
// came on this thread, as Open MPI's ranks poll every BTL between yields:
// otherwise each tcp piece waits for tcp's progress thread to be scheduled
// (one more thread on the crowded cores), read it and signal, while this
// thread yields. Before the doorbell sleep the sockets go back to that
// thread, which then wakes this one (the look after the announcement only
// reads the words). 2 x 2 on 2 cores: 8 B 49.2 against 21.2 us, 1 MiB
// 1608 against 1074 (docs/benchmarks.md "Crowded ranks poll their sockets
// beside the direct words").
void Run::run_direct() {
  if (WaitDriver* mixed = fabric_.mixed_driver()) {
    if (run_mixed(*mixed)) return;
  }
  shm::PollOptions options;
  options.spin = cfg_.direct_spin;
  options.yield_every = yield_every_;
  options.recheck = kDirectRecheck;
  WaitDriver* const sockets = fabric_.mixed_poll_driver();
  bool leased = false;  // sockets polled since they were last handed back
  const auto hand_back = [&] {
    if (leased) sockets->release();
    leased = false;
  };
  // (blocked() decides when to stop: the deadline moves with progress.)
  fabric_.endpoint().poll(
      [&] {
        if (sockets != nullptr) {
          sockets->poll();
          leased = true;
        }
        return step();
      },
      [this] { return step(); }, [this] { return done(); },
      [&](Clock::time_point now) {
        if (blocked(now)) return true;
        hand_back();
        return false;
      },
      Clock::time_point::max(), options);
  // A call that finished keeps the sockets, as a satisfied drive does: the
  // next call polls them at once, and tcp's ticker hands them back after
  // 1 ms without a driver. Two epoll_ctl a socket fewer per call (2 x 2, 8
  // B: 20.1 against 18.0 us, medians of 6 alternating runs).
  if (finished_ != n_) hand_back();
}

// Direct peers and peers on other hosts at once (Fabric::mixed_driver):
// this thread drives the tcp sockets itself, in the driver's one ppoll, and
// that ppoll also watches the wake socket that direct peers' signals (and
// local events: completions, abort) send to while this thread is announced
// as an fd sleeper (common/doorbell.h "Fd sleepers", which argues that no
// wake-up is lost). So a tcp piece is read by the thread that consumes it
// and a same-host piece wakes it directly: one wake-up per piece, where
// run_direct's doorbell sleep needs the tcp progress thread to wake first
// and then ring. After progress it polls the words (and yields, when
// crowded) for up to kMixedSpin before it lets the driver block: a
// same-host answer due within microseconds is then seen without a wake-up
// (without it, 256 KiB hier on the crowded 2 x 2 took 876-963 us against
// 506-815); the spin is short because the sockets go unread meanwhile.
// Every kDirectRecheck blocked() looks at deadline and peers. False when
// the driver gave up (a channel failed): run_direct's poll carries on.
// Only with RDMAFLOW_COLL_MIXED_WAIT=1: under competing load it lost to
// run_direct's polling at 8 B-256 KiB (docs/benchmarks.md).
bool Run::run_mixed(WaitDriver& driver) {
  const Doorbell& bell = fabric_.endpoint().doorbell();
  const int wake_fd = fabric_.endpoint().wake_fd();
  const auto spin = std::min<Clock::duration>(cfg_.direct_spin, kMixedSpin);
  auto spin_until = Clock::now() + spin;
  int polls = 0;
  while (!done()) {
    const auto now = Clock::now();
    if (blocked(now)) return true;
    const auto until = now + kDirectRecheck;
    bell.announce_fd();
    // The drive asks ready() before it first blocks: that is the look
    // after the announcement.
    const bool ok = driver.drive_watching(
        [&] {
          for (;;) {
            const bool moved = step();
            if (done()) return true;
            const auto t = Clock::now();
            if (moved) spin_until = t + spin;
            if (t >= until) return true;
            if (t >= spin_until) return false;
            if (yield_every_ > 0 && ++polls >= yield_every_) {
              polls = 0;
              sched_yield();
            }
          }
        },
        until + Millis(1), wake_fd);
    bell.retire_fd();
    if (!ok) return false;
  }
  return true;
}

// Drives the backend's progress on this thread while spinning: no thread
// hop and no futex wake-up between a notify's arrival and its consumer, and
// the items it enables start from inside the drive, while this thread is
// the registered waiter (the progress thread stays parked and is not woken
// by each post). Every `yield_every` polls the core is offered to others
// (oversubscribed ranks); every kSlice the loop re-checks deadline and
// peers. After `cfg.spin` without progress, it sleeps until something happens.
void Run::run_driven() {
  bool drove = false;  // drove progress since the last sleep
  WaitDriver* const common = fabric_.common_driver();
  while (finished_ < n_ && failure_.is_ok()) {
    uint64_t epoch = sig_.epoch();
    const auto t0 = Clock::now();
    if (common != nullptr && t0 < spin_until_) {
      const bool moved = spin_in_common_driver(*common, t0, epoch);
      drove = true;
      if (moved || done()) continue;
    } else if (step()) {
      progressed(Clock::now());
      continue;
    }

    // Nothing could move: check the peers we wait on, then wait.
    const auto now = Clock::now();
    if (blocked(now)) break;

    if (common != nullptr && now < spin_until_) continue;  // the drive above spins
    if (waiting_peer_ >= 0 && now < spin_until_) {
      if (auto driver = fabric_.peer(waiting_peer_).channel->inbox().wait_driver()) {
        drove = true;
        spin_in_peer_driver(*driver, now, epoch);
        continue;
      }
    }
    if (auto driver = fabric_.common_driver()) {
      drove = false;
      sleep_in_common_driver(*driver, now, epoch);
      continue;
    }
    if (drove) {
      // Going to sleep after driving: hand progress back to the backend's
      // progress thread at once (a drive that ends unsatisfied does), rather
      // than when it next looks up from its back-off.
      drove = false;
      if (waiting_peer_ >= 0) {
        if (auto driver = fabric_.peer(waiting_peer_).channel->inbox().wait_driver()) {
          driver->drive([&] { return sig_.epoch() != epoch; }, Clock::now());
          continue;
        }
      }
    }
    sleep_on_signal(now, epoch);
  }
}

// Something moved at `t`: spin (and poll) again from there.
void Run::progressed(Clock::time_point t) {
  spin_until_ = t + cfg_.spin;
  poll_until_ = t < scratch_.no_poll_until ? t : t + std::min(cfg_.poll, cfg_.spin);
}

// Until when this thread polls rather than lets its drive sleep in the
// backend: crowded ranks for the whole spin, the others for `cfg.poll`.
Clock::time_point Run::poll_end() const {
  return yield_every_ > 0 ? spin_until_ : poll_until_;
}

// Runs the items from inside the common backend driver from the first one
// on: posts then find a registered waiter (the progress thread is not woken
// to carry them and does not compete for this core). True when anything moved.
bool Run::spin_in_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch) {
  if (t0 >= poll_end()) return spin_in_driver(driver, t0, epoch, /*step_first=*/true);
  if (yield_every_ > 0) return poll_common_driver(driver, t0, epoch);
  // A poller that loses its core to another thread had none of its own
  // (a build, or more ranks than the launcher counted): it keeps the peer
  // it waits for, or the competing work, off the CPU until its time slice
  // ends (8 B with --load 2: 2-3 ms against 20-70 us sleeping). So a
  // slice that lost its core (wall time beyond the thread's CPU time) turns
  // polling off for a while. Not the count of involuntary switches: the
  // ticks of a progress thread on the same core raise it on a quiet machine.
  const auto cpu0 = thread_cpu();
  const bool moved = poll_common_driver(driver, t0, epoch);
  const auto now = Clock::now();
  if ((now - t0) - (thread_cpu() - cpu0) > kPreempted) {
    scratch_.no_poll_until = now + kPollBackoff;
    poll_until_ = now;
  }
  return moved;
}

// Crowded ranks (more than one per core) spin as Open MPI's do with
// mpi_yield_when_idle: look at every socket without blocking, run what
// arrived, offer the core to the others (sched_yield) when nothing did,
// for one slice. No rank sleeps on a socket while it spins, so a frame
// costs its receiver no wake-up, and it is taken at the poller's next turn
// rather than when the scheduler gets round to a woken sleeper behind the
// ranks that hold the cores. A rank with a core of its own polls the same
// way without yielding, as Open MPI's ranks do, for `cfg.poll` after
// progress: the sender of a piece then only queues its bytes (no wake-up
// inside its sendmsg) and the receiver takes them at its next look, not
// after the scheduler's latency. True when anything moved.
bool Run::poll_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch) {
  bool moved = false;
  int polls = 0;
  auto slice_end = std::min({deadline_, poll_end(), t0 + kSlice});
  for (bool first = true;; first = false) {
    if (first || sig_.epoch() != epoch) {
      epoch = sig_.epoch();
      if (step()) {
        moved = true;
        const auto t = Clock::now();
        progressed(t);
        slice_end = std::min({deadline_, poll_end(), t + kSlice});
        if (done()) return true;
        continue;  // what it started may have completed already
      }
    }
    if (Clock::now() >= slice_end) return moved;
    driver.poll();
    if (yield_every_ > 0 && sig_.epoch() == epoch && ++polls >= yield_every_) {
      polls = 0;
      sched_yield();
    }
  }
}

// The same through the driver of the peer we wait on, for one slice.
void Run::spin_in_peer_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch) {
  spin_in_driver(driver, now, epoch, /*step_first=*/false);
}

// One slice of spinning inside `driver`. Progress extends the slice, but
// never past the deadline the drive was given: a drive that reaches its
// deadline unsatisfied tells the backend that its waiter goes to sleep (tcp
// hands the socket back to its progress thread: two epoll_ctl, and the next
// frame costs a thread hop), which is wrong while the executor keeps
// spinning. So the slice ends satisfied, at the latest half a slice before
// that deadline, and the next slice starts at once.
bool Run::spin_in_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch,
                         bool step_first) {
  bool first = step_first, moved = false;
  int polls = 0;
  auto slice_end = std::min({deadline_, spin_until_, t0 + kSlice});
  const auto limit = slice_end + kSlice;
  const auto last_end = limit - kSlice / 2;
  driver.drive(
      [&] {
        if (first || sig_.epoch() != epoch) {
          first = false;
          epoch = sig_.epoch();
          if (step()) {
            moved = true;
            const auto t = Clock::now();
            progressed(t);
            slice_end = std::min({deadline_, spin_until_, t + kSlice, last_end});
            if (done() || t < poll_until_) return true;  // back to polling
          }
        }
        if (yield_every_ > 0 && ++polls >= yield_every_) {
          polls = 0;
          sched_yield();
        }
        return Clock::now() >= slice_end;
      },
      limit);
  return moved;
}

// Every peer is served by one backend driver (UCX): sleep inside it. It
// spins a little, then blocks on the backend's own event fd and drives
// progress when it wakes (one wake-up, no progress-thread hop), and whatever
// the items need arrives through it. Events that enable nothing
// (acknowledgements, early credits) are handled in there; back here after
// progress (the next drive spins again before it sleeps: replies come in
// bursts), or every kRecheck to look at deadline and peers.
void Run::sleep_in_common_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch) {
  bool moved = false;
  driver.drive(
      [&] {
        if (sig_.epoch() == epoch) return false;
        epoch = sig_.epoch();
        moved = step();
        return moved;
      },
      std::min(deadline_, now + kRecheck));
  if (moved) progressed(Clock::now());
}

// Spins on the fabric's Signal for what is left of `cfg.spin`, then sleeps
// on it until something happens, for at most kRecheck: then blocked()
// looks at every peer (a failed channel we do not wait on signals nothing)
// and at the deadline (progress made meanwhile moves it).
void Run::sleep_on_signal(Clock::time_point now, uint64_t epoch) {
  const auto spin = std::chrono::duration_cast<std::chrono::microseconds>(
      now < spin_until_ ? spin_until_ - now : Clock::duration(0));
  sig_.wait(epoch, std::min(deadline_, now + kRecheck), spin);
}

}  // namespace rdmaflow::executor_detail
