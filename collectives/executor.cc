#include "collectives/executor.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collective_trace.h"
#include "collectives/reduce_kernels.h"
#include "transport/shm/memory_channel.h"

namespace rdmaflow {
namespace {

using Clock = std::chrono::steady_clock;

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

// Write completions, filled on progress threads, drained by the executor.
struct Completions {
  std::mutex mu;
  std::vector<uint32_t> done;
  Status error;
  int error_peer = -1;
  size_t in_flight = 0;  // guarded by mu
  // Set (under mu) with every entry of done / error: the executor polls this
  // flag, not the mutex.
  std::atomic<bool> pending{false};
};

std::string item_text(const Item& it, uint64_t seq) {
  std::string s = it.kind == ItemKind::kSend ? "sending" : "receiving";
  s += " piece " + std::to_string(seq) + " of step " + std::to_string(it.step) +
       (it.kind == ItemKind::kSend ? " to" : " from") + " rank " + std::to_string(it.peer);
  return s;
}

// One execute() call. The phases, in order: prepare() turns the program's
// dependency lists into a dependents graph and reads the lane's sequence
// bases; the run loops (run_direct() for same-host direct peers, run_driven()
// otherwise) call step() to start every ready item and, while nothing can
// move, wait; complete() settles the lane afterwards.
class Run {
 public:
  Run(Fabric& fabric, const Program& program, int lane, Clock::time_point deadline,
      const std::string& what)
      : fabric_(fabric),
        program_(program),
        items_(program.items()),
        n_(items_.size()),
        lane_(lane),
        world_(program.world()),
        es_(program.elem_size()),
        cfg_(fabric.config()),
        patience_(deadline - Clock::now()),
        deadline_(deadline),
        what_(what),
        sig_(fabric.signal()),
        yield_every_(fabric.yield_polls()),
        scratch_(thread_scratch()) {}

  Status execute() {
    prepare();
    if (fabric_.direct_peers() > 0) {
      run_direct();
    } else {
      progressed(Clock::now());
    }
    run_driven();
    return complete();
  }

 private:
  // Reused by the calls on this thread (no allocation per call).
  struct Scratch {
    std::vector<uint32_t> remaining, dep_begin, dependents, cursor, ready, inflight, drained;
    std::vector<uint64_t> send_base, recv_base;
    // Receives by peer and ordinal: recv_items[recv_begin[p] + ordinal].
    std::vector<uint32_t> recv_begin, recv_items;
    std::vector<uint8_t> recv_state;    // per item: RecvState
    Clock::time_point no_poll_until{};  // preempted while polling: sleep until then
  };
  static Scratch& thread_scratch() {
    thread_local Scratch scratch;
    return scratch;
  }

  bool done() const { return finished_ == n_ || !failure_.is_ok(); }

  enum RecvState : uint8_t { kWaiting = 0, kLanding = 1, kConsumed = 2 };

  // ---- prepare ----

  // Dependents of item i: scratch_.dependents[dep_begin[i] .. dep_begin[i + 1]).
  // Items without dependencies start ready. Sends and receives count from the
  // lane's sequence numbers.
  void prepare() {
    auto& remaining = scratch_.remaining;
    auto& dep_begin = scratch_.dep_begin;
    auto& dependents = scratch_.dependents;
    auto& ready = scratch_.ready;
    remaining.assign(n_, 0);
    dep_begin.assign(n_ + 1, 0);
    ready.clear();
    for (size_t i = 0; i < n_; ++i) {
      remaining[i] = static_cast<uint32_t>(program_.deps(i).size());
      for (uint32_t d : program_.deps(i)) ++dep_begin[d + 1];
      if (remaining[i] == 0) ready.push_back(static_cast<uint32_t>(i));
    }
    for (size_t i = 0; i < n_; ++i) dep_begin[i + 1] += dep_begin[i];
    scratch_.cursor.assign(dep_begin.begin(), dep_begin.end() - 1);
    dependents.resize(dep_begin[n_]);
    for (size_t i = 0; i < n_; ++i) {
      for (uint32_t d : program_.deps(i)) {
        dependents[scratch_.cursor[d]++] = static_cast<uint32_t>(i);
      }
    }
    auto& send_base = scratch_.send_base;
    auto& recv_base = scratch_.recv_base;
    send_base.assign(world_, 0);
    recv_base.assign(world_, 0);
    // Only the directions this program uses are read (and advanced in
    // complete()): send() and recv() run the two directions of a lane on
    // different threads.
    for (int p = 0; p < world_; ++p) {
      if (p == fabric_.rank()) continue;
      if (program_.sends_to(p)) send_base[p] = fabric_.peer(p).send_seq[lane_];
      if (program_.recvs_from(p)) recv_base[p] = fabric_.peer(p).recv_seq[lane_];
    }
    // Sends in flight per peer (their completions are awaited).
    scratch_.inflight.assign(world_, 0);
    scratch_.drained.clear();
    landing_ = may_land();
    if (!landing_) return;
    index_receives();
    for (uint32_t i : ready) land(i);
  }

  // Whether any receive of this program could land (land()): a copy of at
  // least land_min bytes from a peer off the direct path. Most small calls
  // have none and skip the rest of the bookkeeping.
  bool may_land() const {
    if (cfg_.land_min == 0) return false;
    for (const Item& it : items_) {
      if (it.kind == ItemKind::kRecv && !it.reduce && it.elems * es_ >= cfg_.land_min &&
          !fabric_.peer(it.peer).direct) {
        return true;
      }
    }
    return false;
  }

  // Where piece `seq` from `peer` arrives on this lane.
  std::byte* slot_of(int peer, uint64_t seq) {
    return fabric_.peer(peer).local + fabric_.slot_offset(lane_, seq);
  }

  void index_receives() {
    auto& begin = scratch_.recv_begin;
    auto& items = scratch_.recv_items;
    begin.assign(world_ + 1, 0);
    for (const Item& it : items_) {
      if (it.kind == ItemKind::kRecv) ++begin[it.peer + 1];
    }
    for (int p = 0; p < world_; ++p) begin[p + 1] += begin[p];
    items.assign(begin[world_], UINT32_MAX);
    for (size_t i = 0; i < n_; ++i) {
      const Item& it = items_[i];
      if (it.kind != ItemKind::kRecv) continue;
      const uint64_t at = begin[it.peer] + it.ordinal;
      if (it.ordinal < begin[it.peer + 1] - begin[it.peer]) items[at] = static_cast<uint32_t>(i);
    }
    scratch_.recv_state.assign(n_, kWaiting);
  }

  // The receive of `peer`'s piece `ordinal` in this program, or UINT32_MAX.
  uint32_t recv_item(int peer, uint64_t ordinal) const {
    const auto& begin = scratch_.recv_begin;
    if (ordinal >= begin[peer + 1] - begin[peer]) return UINT32_MAX;
    return scratch_.recv_items[begin[peer] + ordinal];
  }

  // ---- landing (FabricConfig::land_min) ----

  // Ready receive i copies its piece out of the slot: ask the peer's backend
  // to put the piece at its destination instead. Only once the slot is free
  // (its earlier piece consumed: in an earlier call, or by this one before
  // the credit that lets the peer send this piece, so that every frame of it
  // arrives after the landing). Ready means every item the receive depends on
  // is done, so the bytes may arrive in dst from now on: the executor's own
  // copy could run now.
  void land(uint32_t i) {
    const Item& it = items_[i];
    if (!landing_ || it.kind != ItemKind::kRecv || it.reduce) return;
    const size_t bytes = it.elems * es_;
    if (bytes < cfg_.land_min || scratch_.recv_state[i] != kWaiting) return;
    Fabric::Peer& peer = fabric_.peer(it.peer);
    if (peer.direct || !peer.channel) return;
    if (it.ordinal >= static_cast<uint64_t>(cfg_.slots)) {
      const uint32_t before = recv_item(it.peer, it.ordinal - cfg_.slots);
      if (before == UINT32_MAX || scratch_.recv_state[before] != kConsumed) return;
    }
    const uint64_t seq = scratch_.recv_base[it.peer] + it.ordinal;
    if (fabric_.data_arrived(it.peer, lane_, seq)) return;  // too late to move it
    if (peer.channel->post_landing(slot_of(it.peer, seq), bytes, it.dst)) {
      scratch_.recv_state[i] = kLanding;
      ++landings_;
    }
  }

  // Withdraws receive i's landing and copies what did not land from `slot`.
  void take_landing(const Item& it, uint32_t i, const std::byte* slot) {
    Channel::Landed got = fabric_.peer(it.peer).channel->take_landing(slot);
    scratch_.recv_state[i] = kWaiting;
    --landings_;
    const size_t bytes = it.elems * es_;
    std::sort(got.ranges, got.ranges + got.count,
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
    size_t at = 0, copied = 0;
    auto* dst = static_cast<std::byte*>(it.dst);
    for (int k = 0; k <= got.count; ++k) {
      const size_t end = k < got.count ? got.ranges[k].offset : bytes;
      if (end > at) {
        std::memcpy(dst + at, slot + at, end - at);
        copied += end - at;
      }
      if (k < got.count) at = std::max(at, got.ranges[k].offset + got.ranges[k].len);
    }
    fabric_.count_landing(copied);
  }

  // A failed call: no landing may outlive it (its dst is the caller's).
  void withdraw_landings() {
    for (uint32_t i = 0; i < n_ && landings_ > 0; ++i) {
      if (scratch_.recv_state[i] != kLanding) continue;
      const Item& it = items_[i];
      fabric_.peer(it.peer).channel->take_landing(
          slot_of(it.peer, scratch_.recv_base[it.peer] + it.ordinal));
      scratch_.recv_state[i] = kWaiting;
      --landings_;
    }
  }

  // ---- start items ----

  void finish(uint32_t i) {
    ++finished_;
    const auto& dep_begin = scratch_.dep_begin;
    auto& remaining = scratch_.remaining;
    for (uint32_t k = dep_begin[i]; k < dep_begin[i + 1]; ++k) {
      const uint32_t d = scratch_.dependents[k];
      if (--remaining[d] == 0) {
        scratch_.ready.push_back(d);
        land(d);
      }
    }
  }

  // One pass: take write completions, start every ready item whose remote
  // condition holds. True when anything moved.
  bool step() {
    bool progressed = drain_completions();
    if (!failure_.is_ok()) return true;
    auto& ready = scratch_.ready;
    for (size_t k = 0; k < ready.size();) {
      if (start(ready[k])) {
        progressed = true;
        ready[k] = ready.back();
        ready.pop_back();
      } else {
        ++k;
      }
    }
    return progressed;
  }

  // Finishes the sends whose writes completed; records a write's failure.
  bool drain_completions() {
    auto& drained = scratch_.drained;
    if (comps_ && comps_->pending.load(std::memory_order_acquire)) {
      comps_->pending.store(false, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(comps_->mu);
      drained.swap(comps_->done);
      if (!comps_->error.is_ok()) failure_ = comps_->error;
    }
    for (uint32_t i : drained) {
      --scratch_.inflight[items_[i].peer];
      finish(i);
    }
    const bool progressed = !drained.empty();
    drained.clear();
    return progressed;
  }

  // Starts ready item i if its remote condition holds (a send needs the
  // credit of its slot, a receive its piece's notify); false when it must wait.
  bool start(uint32_t i) {
    const Item& it = items_[i];
    if (it.kind == ItemKind::kSend) return start_send(i, it);
    if (it.kind == ItemKind::kRecv) return start_recv(i, it);
    run_local(it);
    finish(i);
    return true;
  }

  void run_local(const Item& it) {
    const trace::Span span(trace::kCollective, item_name(it), piece_args(it, es_));
    switch (it.kind) {
      case ItemKind::kCopy:
        std::memmove(it.dst, it.src, it.elems * es_);
        break;
      case ItemKind::kScale:
        scale_average(program_.type(), it.dst, it.elems, world_);
        break;
      case ItemKind::kReduce:
        reduce_buffers(program_.type(), program_.op(), it.dst, it.dst, it.src, it.elems);
        break;
      case ItemKind::kSend:
      case ItemKind::kRecv:
        break;  // start() runs them
    }
  }

  bool start_send(uint32_t i, const Item& it) {
    const uint64_t seq = scratch_.send_base[it.peer] + it.ordinal;
    if (seq >= static_cast<uint64_t>(cfg_.slots) &&
        !fabric_.credit_arrived(it.peer, lane_, seq - cfg_.slots)) {
      return false;
    }
    const trace::Span span(trace::kCollective, item_name(it), piece_args(it, es_));
    Fabric::Peer& peer = fabric_.peer(it.peer);
    const size_t bytes = it.elems * es_;
    if (peer.direct) {
      Status st = fabric_.send_direct(it.peer, lane_, seq, it.src, bytes);
      if (!st.is_ok()) {
        failure_ = std::move(st);
        return false;
      }
      finish(i);
      return true;
    }
    if (bytes <= Fabric::kSmallBytes) {
      fabric_.send_small(it.peer, lane_, seq, it.src, bytes);
      finish(i);
      return true;
    }
    const void* src = it.src;
    if (peer.staged) {
      // A buffer of user_memory() is registered with the peer's transport:
      // the write can read it where it is.
      const bool registered = fabric_.user_memory()->contains(it.src, bytes);
      if (!registered) {
        std::byte* stage = peer.local + fabric_.stage_offset() + fabric_.slot_offset(lane_, seq);
        std::memcpy(stage, it.src, bytes);
        src = stage;
      }
      fabric_.count_staged_piece(registered);
    }
    if (!comps_) comps_ = std::make_shared<Completions>();
    {
      std::lock_guard<std::mutex> lock(comps_->mu);
      ++comps_->in_flight;
    }
    fabric_.count_notify_piece();
    const int p = it.peer;
    Signal* s = &sig_;
    // Posted: nothing waits for the peer's word about the piece (its credit
    // answers), so over tcp it completes once its bytes left this process
    // rather than a round trip later (the ACK held the sender of the last
    // piece of a step until the peer had read it).
    peer.channel->post_write(
        src, bytes, peer.remote, fabric_.slot_offset(lane_, seq),
        notify_code::encode(notify_code::kData, lane_, seq),
        [comps = comps_, i, p, s](const Status& st) {
          {
            std::lock_guard<std::mutex> lock(comps->mu);
            --comps->in_flight;
            if (st.is_ok()) {
              comps->done.push_back(i);
            } else if (comps->error.is_ok()) {
              comps->error = st;
              comps->error_peer = p;
            }
            comps->pending.store(true, std::memory_order_release);
          }
          s->notify();
        },
        std::chrono::duration_cast<Millis>(deadline_ - Clock::now()) + Millis(1));
    ++scratch_.inflight[p];
    return true;  // finishes when the write completes
  }

  bool start_recv(uint32_t i, const Item& it) {
    const uint64_t seq = scratch_.recv_base[it.peer] + it.ordinal;
    if (!fabric_.data_arrived(it.peer, lane_, seq)) return false;
    const trace::Span span(trace::kCollective, item_name(it), piece_args(it, es_));
    const std::byte* slot = slot_of(it.peer, seq);
    if (it.reduce) {
      reduce_buffers(program_.type(), program_.op(), it.dst, it.src, slot, it.elems);
    } else if (landing_ && scratch_.recv_state[i] == kLanding) {
      take_landing(it, i, slot);
    } else {
      std::memcpy(it.dst, slot, it.elems * es_);
    }
    if (landing_) {
      scratch_.recv_state[i] = kConsumed;
      // The piece after this one in the slot cannot have left the peer before
      // the credit below: its landing goes first.
      const uint32_t next = recv_item(it.peer, it.ordinal + cfg_.slots);
      if (next != UINT32_MAX && scratch_.remaining[next] == 0) land(next);
    }
    Status st = fabric_.return_credit(it.peer, lane_, seq);  // hand the slot back
    if (!st.is_ok()) failure_ = std::move(st);
    finish(i);
    return true;
  }

  // ---- wait ----

  // Nothing can move: fails the call when a peer failed, the communicator was
  // aborted or the deadline passed (true); else names what we wait for. The
  // deadline is about progress, not total time: every finished piece moves it
  // to `patience_` from now, so a large collective on a slow link runs as long
  // as its bytes keep moving, and a stalled one fails `patience_` after its
  // last piece.
  bool blocked(Clock::time_point now) {
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
  std::string waiting_text() const {
    if (waiting_item_ < 0) return "write completions";
    const Item& it = items_[static_cast<size_t>(waiting_item_)];
    const uint64_t seq =
        (it.kind == ItemKind::kSend ? scratch_.send_base : scratch_.recv_base)[it.peer] +
        it.ordinal;
    std::string text = item_text(it, seq);
    if (it.kind == ItemKind::kSend) text += " (waiting for its slot to be freed)";
    return text;
  }

  Status timeout_error() const {
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
  void run_direct() {
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
    hand_back();
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
  bool run_mixed(WaitDriver& driver) {
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
  void run_driven() {
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
  void progressed(Clock::time_point t) {
    spin_until_ = t + cfg_.spin;
    poll_until_ = t < scratch_.no_poll_until ? t : t + std::min(cfg_.poll, cfg_.spin);
  }

  // Until when this thread polls rather than lets its drive sleep in the
  // backend: crowded ranks for the whole spin, the others for `cfg.poll`.
  Clock::time_point poll_end() const { return yield_every_ > 0 ? spin_until_ : poll_until_; }

  // Runs the items from inside the common backend driver from the first one
  // on: posts then find a registered waiter (the progress thread is not woken
  // to carry them and does not compete for this core). True when anything moved.
  bool spin_in_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch) {
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
  bool poll_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch) {
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
  void spin_in_peer_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch) {
    spin_in_driver(driver, now, epoch, /*step_first=*/false);
  }

  // One slice of spinning inside `driver`. Progress extends the slice, but
  // never past the deadline the drive was given: a drive that reaches its
  // deadline unsatisfied tells the backend that its waiter goes to sleep (tcp
  // hands the socket back to its progress thread: two epoll_ctl, and the next
  // frame costs a thread hop), which is wrong while the executor keeps
  // spinning. So the slice ends satisfied, at the latest half a slice before
  // that deadline, and the next slice starts at once.
  bool spin_in_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch, bool step_first) {
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
  void sleep_in_common_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch) {
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
  void sleep_on_signal(Clock::time_point now, uint64_t epoch) {
    const auto spin = std::chrono::duration_cast<std::chrono::microseconds>(
        now < spin_until_ ? spin_until_ - now : Clock::duration(0));
    sig_.wait(epoch, std::min(deadline_, now + kRecheck), spin);
  }

  // ---- complete ----

  // On failure, waits for the writes still reading our buffers (they finish
  // or time out) before returning. On success, advances the lane's sequence
  // numbers past this program's pieces.
  Status complete() {
    if (landings_ > 0) withdraw_landings();
    if (!failure_.is_ok()) {
      while (comps_) {
        const uint64_t epoch = sig_.epoch();
        {
          std::lock_guard<std::mutex> lock(comps_->mu);
          if (comps_->in_flight == 0) break;
        }
        sig_.wait(epoch, Clock::now() + Millis(100), std::chrono::microseconds(0));
      }
      return failure_.with_op(what_);
    }
    for (int p = 0; p < world_; ++p) {
      if (p == fabric_.rank()) continue;
      if (program_.sends_to(p)) fabric_.peer(p).send_seq[lane_] += program_.sends_to(p);
      if (program_.recvs_from(p)) fabric_.peer(p).recv_seq[lane_] += program_.recvs_from(p);
    }
    return Status::ok();
  }

  Fabric& fabric_;
  const Program& program_;
  const std::vector<Item>& items_;
  const size_t n_;
  const int lane_;
  const int world_;
  const size_t es_;
  const FabricConfig& cfg_;
  const Clock::duration patience_;  // how long the call may go without progress
  Clock::time_point deadline_;      // moved by progress (blocked())
  const std::string& what_;
  Signal& sig_;
  const int yield_every_;
  Scratch& scratch_;

  std::shared_ptr<Completions> comps_;  // made by the first write that needs one
  size_t finished_ = 0;
  bool landing_ = false;      // may_land(): the landing bookkeeping below is kept
  size_t landings_ = 0;       // receives whose landing is posted
  size_t finished_seen_ = 0;  // finished_ when blocked() last moved the deadline
  Status failure_;
  Clock::time_point spin_until_;      // spin (drive, poll) rather than sleep until then
  Clock::time_point poll_until_;      // not crowded: poll rather than drive until then
  Clock::time_point next_peer_scan_;  // blocked() looks at every peer's channel then
  int waiting_peer_ = -1;             // set by blocked(): the peer we wait on, or -1
  int64_t waiting_item_ = -1;         // ... and the item, or -1: write completions
};

}  // namespace

Status execute(Fabric& fabric, const Program& program, int lane, Clock::time_point deadline,
               const std::string& what) {
  if (program.items().empty()) return Status::ok();
  if (Status st = fabric.detached_error(); !st.is_ok()) return st.with_op(what);
  const trace::Span span(trace::kCollective, "program", program_args(program, what));
  return Run(fabric, program, lane, deadline, what).execute();
}

}  // namespace rdmaflow
