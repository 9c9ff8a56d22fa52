#include "collectives/executor.h"

#include <sched.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "common/doorbell.h"

namespace rdmaflow {
namespace {

using Clock = std::chrono::steady_clock;

// Longest stretch of driving before the executor re-checks deadline and peers.
constexpr auto kSlice = std::chrono::microseconds(20);
// The same while it sleeps inside the backend's driver.
constexpr auto kRecheck = std::chrono::milliseconds(100);
// ... or on the doorbell (direct peers).
constexpr auto kDirectRecheck = std::chrono::milliseconds(20);

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

}  // namespace

Status execute(Fabric& fabric, const Program& program, int lane, Clock::time_point deadline,
               const std::string& what) {
  const auto& items = program.items();
  const size_t n = items.size();
  if (n == 0) return Status::ok();
  if (Status st = fabric.detached_error(); !st.is_ok()) return st.with_op(what);
  const int world = program.world();
  const size_t es = program.elem_size();
  const FabricConfig& cfg = fabric.config();

  // Scratch reused by the calls on this thread (no allocation per call).
  thread_local struct Scratch {
    std::vector<uint32_t> remaining, dep_begin, dependents, cursor, ready, inflight, drained;
    std::vector<uint64_t> send_base, recv_base;
  } scratch;
  auto& remaining = scratch.remaining;
  auto& dep_begin = scratch.dep_begin;  // dependents of i: [dep_begin[i], dep_begin[i + 1])
  auto& dependents = scratch.dependents;
  auto& ready = scratch.ready;
  remaining.assign(n, 0);
  dep_begin.assign(n + 1, 0);
  ready.clear();
  for (size_t i = 0; i < n; ++i) {
    remaining[i] = static_cast<uint32_t>(program.deps(i).size());
    for (uint32_t d : program.deps(i)) ++dep_begin[d + 1];
    if (remaining[i] == 0) ready.push_back(static_cast<uint32_t>(i));
  }
  for (size_t i = 0; i < n; ++i) dep_begin[i + 1] += dep_begin[i];
  scratch.cursor.assign(dep_begin.begin(), dep_begin.end() - 1);
  dependents.resize(dep_begin[n]);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t d : program.deps(i)) dependents[scratch.cursor[d]++] = static_cast<uint32_t>(i);
  }
  auto& send_base = scratch.send_base;
  auto& recv_base = scratch.recv_base;
  send_base.assign(world, 0);
  recv_base.assign(world, 0);
  for (int p = 0; p < world; ++p) {
    if (p == fabric.rank()) continue;
    send_base[p] = fabric.peer(p).send_seq[lane];
    recv_base[p] = fabric.peer(p).recv_seq[lane];
  }

  std::shared_ptr<Completions> comps;  // made by the first write that needs one
  Signal& sig = fabric.signal();
  size_t finished = 0;
  Status failure;

  auto finish = [&](uint32_t i) {
    ++finished;
    for (uint32_t k = dep_begin[i]; k < dep_begin[i + 1]; ++k) {
      if (--remaining[dependents[k]] == 0) ready.push_back(dependents[k]);
    }
  };

  // Sends in flight per peer (their completions are awaited).
  auto& inflight = scratch.inflight;
  inflight.assign(world, 0);
  auto& drained = scratch.drained;
  drained.clear();

  // One pass: take write completions, start every ready item whose remote
  // condition holds. True when anything moved.
  auto step = [&]() -> bool {
    bool progressed = false;
    if (comps && comps->pending.load(std::memory_order_acquire)) {
      comps->pending.store(false, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(comps->mu);
      drained.swap(comps->done);
      if (!comps->error.is_ok()) failure = comps->error;
    }
    for (uint32_t i : drained) {
      --inflight[items[i].peer];
      finish(i);
    }
    progressed |= !drained.empty();
    drained.clear();
    if (!failure.is_ok()) return true;
    for (size_t k = 0; k < ready.size();) {
      const uint32_t i = ready[k];
      const Item& it = items[i];
      bool started = false;
      switch (it.kind) {
        case ItemKind::kSend: {
          const uint64_t seq = send_base[it.peer] + it.ordinal;
          if (seq >= static_cast<uint64_t>(cfg.slots) &&
              !fabric.credit_arrived(it.peer, lane, seq - cfg.slots)) {
            break;
          }
          Fabric::Peer& peer = fabric.peer(it.peer);
          const size_t bytes = it.elems * es;
          if (peer.direct) {
            fabric.send_direct(it.peer, lane, seq, it.src, bytes);
            started = true;
            finish(i);
            break;
          }
          if (bytes <= Fabric::kSmallBytes) {
            fabric.send_small(it.peer, lane, seq, it.src, bytes);
            started = true;
            finish(i);
            break;
          }
          const void* src = it.src;
          if (peer.staged) {
            std::byte* stage = peer.local + fabric.stage_offset() + fabric.slot_offset(lane, seq);
            std::memcpy(stage, it.src, bytes);
            src = stage;
          }
          if (!comps) comps = std::make_shared<Completions>();
          {
            std::lock_guard<std::mutex> lock(comps->mu);
            ++comps->in_flight;
          }
          fabric.count_notify_piece();
          const int p = it.peer;
          Signal* s = &sig;
          peer.channel->write(
              src, bytes, peer.remote, fabric.slot_offset(lane, seq),
              notify_code::encode(notify_code::kData, lane, seq),
              [comps, i, p, s](const Status& st) {
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
              std::chrono::duration_cast<Millis>(deadline - Clock::now()) + Millis(1));
          ++inflight[p];
          started = true;  // finishes when the write completes
          break;
        }
        case ItemKind::kRecv: {
          const uint64_t seq = recv_base[it.peer] + it.ordinal;
          if (!fabric.data_arrived(it.peer, lane, seq)) break;
          Fabric::Peer& peer = fabric.peer(it.peer);
          const std::byte* slot = peer.local + fabric.slot_offset(lane, seq);
          if (it.reduce) {
            reduce_buffers(program.type(), program.op(), it.dst, it.src, slot, it.elems);
          } else {
            std::memcpy(it.dst, slot, it.elems * es);
          }
          fabric.return_credit(it.peer, lane, seq);  // hand the slot back
          started = true;
          finish(i);
          break;
        }
        case ItemKind::kCopy:
          std::memmove(it.dst, it.src, it.elems * es);
          started = true;
          finish(i);
          break;
        case ItemKind::kScale:
          scale_average(program.type(), it.dst, it.elems, world);
          started = true;
          finish(i);
          break;
        case ItemKind::kReduce:
          reduce_buffers(program.type(), program.op(), it.dst, it.dst, it.src, it.elems);
          started = true;
          finish(i);
          break;
      }
      if (started) {
        progressed = true;
        ready[k] = ready.back();
        ready.pop_back();
      } else {
        ++k;
      }
    }
    return progressed;
  };

  // Nothing can move: fails the call when a peer we wait on failed or the
  // deadline passed (true); else names what we wait for.
  int waiting_peer = -1;
  std::string waiting_for;
  auto blocked = [&](Clock::time_point now) -> bool {
    waiting_peer = -1;
    waiting_for = "write completions";
    for (uint32_t i : ready) {
      const Item& it = items[i];
      if (it.peer < 0) continue;
      Status st = fabric.peer_error(it.peer);
      if (!st.is_ok()) {
        failure = st;
        return true;
      }
      if (waiting_peer < 0) {
        waiting_peer = it.peer;
        const uint64_t seq =
            (it.kind == ItemKind::kSend ? send_base[it.peer] : recv_base[it.peer]) + it.ordinal;
        waiting_for = item_text(it, seq);
        if (it.kind == ItemKind::kSend) waiting_for += " (waiting for its slot to be freed)";
      }
    }
    failure = fabric.detached_error();
    if (!failure.is_ok()) return true;
    for (int p = 0; p < world && waiting_peer < 0; ++p) {
      if (inflight[p] > 0) waiting_peer = p;
    }
    if (now >= deadline) {
      failure = RDMAFLOW_ERROR(Code::kTimeout, what, waiting_peer,
                               "no progress before the deadline while " + waiting_for + " (" +
                                   std::to_string(finished) + " of " + std::to_string(n) +
                                   " pieces done)");
      return true;
    }
    return false;
  };

  const bool direct = fabric.direct_peers() > 0;
  auto spin_until = direct ? Clock::time_point() : Clock::now() + cfg.spin;
  const int yield_every = fabric.yield_polls();
  if (direct) {
    // Same-host direct peers store pieces and credits straight into our
    // memory: poll (the loads are the whole cost) until `cfg.direct_spin` passed
    // without progress, then sleep on the doorbell, which they ring (and so
    // do local completions, for peers on the notify path). The sleep is cut
    // into kDirectRecheck slices to notice a dead peer.
    const Doorbell& bell = fabric.doorbell();
    int polls = 0;
    bool moved = true;  // progress since the clock was last read (the start counts)
    while (finished < n && failure.is_ok()) {
      if (step()) {
        moved = true;
        polls = 0;
        continue;
      }
      // The clock only every 16 idle polls (it is most of a poll's cost).
      if ((++polls & 15) != 0 && cfg.direct_spin.count() > 0) {
        if (yield_every > 0 && polls % yield_every == 0) sched_yield();
        continue;
      }
      const auto now = Clock::now();
      if (moved) {
        moved = false;
        spin_until = now + cfg.direct_spin;
      }
      if (now < spin_until) {
        if (yield_every > 0) sched_yield();
        continue;
      }
      if (blocked(now)) break;
      const uint32_t ticket = bell.announce();
      if (step()) {
        bell.retire();
        moved = true;
        continue;
      }
      fabric.count_sleep();
      bell.sleep(ticket, std::min<Clock::duration>(deadline - now, kDirectRecheck));
      bell.retire();
    }
  }

  bool drove = false;  // drove progress since the last sleep
  WaitDriver* const common = fabric.common_driver();
  while (finished < n && failure.is_ok()) {
    uint64_t epoch = sig.epoch();
    const auto t0 = Clock::now();
    if (common != nullptr && t0 < spin_until) {
      // Run the items from inside the backend's driver from the first one
      // on: posts then find a registered waiter (the progress thread is not
      // woken to carry them and does not compete for this core).
      bool first = true, moved = false;
      int polls = 0;
      auto slice_end = std::min({deadline, spin_until, t0 + kSlice});
      common->drive(
          [&] {
            if (first || sig.epoch() != epoch) {
              first = false;
              epoch = sig.epoch();
              if (step()) {
                moved = true;
                const auto t = Clock::now();
                spin_until = t + cfg.spin;
                slice_end = std::min({deadline, spin_until, t + kSlice});
                if (finished == n || !failure.is_ok()) return true;
              }
            }
            if (yield_every > 0 && ++polls >= yield_every) {
              polls = 0;
              sched_yield();
            }
            return Clock::now() >= slice_end;
          },
          slice_end + kSlice);
      drove = true;
      if (moved || finished == n || !failure.is_ok()) continue;
    } else if (step()) {
      spin_until = Clock::now() + cfg.spin;
      continue;
    }

    // Nothing could move: check the peers we wait on, then wait.
    const auto now = Clock::now();
    if (blocked(now)) break;

    // Drive the backend's progress on this thread: no thread hop and no futex
    // wake-up between a notify's arrival and its consumer, and the items it
    // enables start from inside the drive, while this thread is the
    // registered waiter (the progress thread stays parked and is not woken by
    // each post). Every `yield_every` polls the core is offered to others
    // (oversubscribed ranks); every kSlice the loop re-checks deadline and
    // peers. After `cfg.spin` without progress, sleep until something happens.
    if (common != nullptr && now < spin_until) continue;  // the drive above spins
    if (waiting_peer >= 0 && now < spin_until) {
      if (auto driver = fabric.peer(waiting_peer).channel->inbox().wait_driver()) {
        drove = true;
        int polls = 0;
        auto slice_end = std::min({deadline, spin_until, now + kSlice});
        driver->drive(
            [&] {
              if (sig.epoch() != epoch) {
                epoch = sig.epoch();
                if (step()) {
                  const auto t = Clock::now();
                  spin_until = t + cfg.spin;
                  slice_end = std::min({deadline, spin_until, t + kSlice});
                  if (finished == n || !failure.is_ok()) return true;
                }
              }
              if (yield_every > 0 && ++polls >= yield_every) {
                polls = 0;
                sched_yield();
              }
              return Clock::now() >= slice_end;
            },
            slice_end + kSlice);
        continue;
      }
    }
    if (auto driver = fabric.common_driver()) {
      // Every peer is served by one backend driver (UCX): sleep inside it.
      // It spins a little, then blocks on the backend's own event fd and
      // drives progress when it wakes (one wake-up, no progress-thread hop),
      // and whatever the items need arrives through it. Events that enable
      // nothing (acknowledgements, early credits) are handled in there; back
      // here after progress (the next drive spins again before it sleeps:
      // replies come in bursts), or every kRecheck to look at deadline and peers.
      drove = false;
      bool moved = false;
      driver->drive(
          [&] {
            if (sig.epoch() == epoch) return false;
            epoch = sig.epoch();
            moved = step();
            return moved;
          },
          std::min(deadline, now + kRecheck));
      if (moved) spin_until = Clock::now() + cfg.spin;
      continue;
    }
    if (drove) {
      // Going to sleep after driving: hand progress back to the backend's
      // progress thread at once (a drive that ends unsatisfied does), rather
      // than when it next looks up from its back-off.
      drove = false;
      if (waiting_peer >= 0) {
        if (auto driver = fabric.peer(waiting_peer).channel->inbox().wait_driver()) {
          driver->drive([&] { return sig.epoch() != epoch; }, Clock::now());
          continue;
        }
      }
    }
    const auto spin = std::chrono::duration_cast<std::chrono::microseconds>(
        now < spin_until ? spin_until - now : Clock::duration(0));
    if (!sig.wait(epoch, deadline, spin) && Clock::now() >= deadline) {
      failure = RDMAFLOW_ERROR(Code::kTimeout, what, waiting_peer,
                               "no progress before the deadline while " + waiting_for + " (" +
                                   std::to_string(finished) + " of " + std::to_string(n) +
                                   " pieces done)");
    }
  }

  if (!failure.is_ok()) {
    // Writes still reading our buffers must finish (or time out) before we return.
    while (comps) {
      const uint64_t epoch = sig.epoch();
      {
        std::lock_guard<std::mutex> lock(comps->mu);
        if (comps->in_flight == 0) break;
      }
      sig.wait(epoch, Clock::now() + Millis(100), std::chrono::microseconds(0));
    }
    return failure.with_op(what);
  }
  // Advance the lane's sequence numbers past this program's pieces.
  for (int p = 0; p < world; ++p) {
    if (p == fabric.rank()) continue;
    fabric.peer(p).send_seq[lane] += program.sends_to(p);
    fabric.peer(p).recv_seq[lane] += program.recvs_from(p);
  }
  return Status::ok();
}

}  // namespace rdmaflow
