#include "collectives/executor.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collective_trace.h"
#include "collectives/executor_run.h"
#include "collectives/reduce_kernels.h"

namespace rdmaflow {
namespace executor_detail {

Run::Run(Fabric& fabric, const Program& program, int lane, Clock::time_point deadline,
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

Status Run::execute() {
  prepare();
  if (fabric_.direct_peers() > 0) {
    run_direct();
  } else {
    progressed(Clock::now());
  }
  run_driven();
  return complete();
}

Run::Scratch& Run::thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// ---- prepare ----

// Dependents of item i: scratch_.dependents[dep_begin[i] .. dep_begin[i + 1]).
// Items without dependencies start ready. Sends and receives count from the
// lane's sequence numbers.
void Run::prepare() {
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
bool Run::may_land() const {
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
std::byte* Run::slot_of(int peer, uint64_t seq) {
  return fabric_.peer(peer).local + fabric_.slot_offset(lane_, seq);
}

void Run::index_receives() {
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
uint32_t Run::recv_item(int peer, uint64_t ordinal) const {
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
void Run::land(uint32_t i) {
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
void Run::take_landing(const Item& it, uint32_t i, const std::byte* slot) {
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
void Run::withdraw_landings() {
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

void Run::finish(uint32_t i) {
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
bool Run::step() {
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
bool Run::drain_completions() {
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
bool Run::start(uint32_t i) {
  const Item& it = items_[i];
  if (it.kind == ItemKind::kSend) return start_send(i, it);
  if (it.kind == ItemKind::kRecv) return start_recv(i, it);
  run_local(it);
  finish(i);
  return true;
}

void Run::run_local(const Item& it) {
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

bool Run::start_send(uint32_t i, const Item& it) {
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

bool Run::start_recv(uint32_t i, const Item& it) {
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

// ---- complete ----

// On failure, waits for the writes still reading our buffers (they finish
// or time out) before returning. On success, advances the lane's sequence
// numbers past this program's pieces.
Status Run::complete() {
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

}  // namespace executor_detail

Status execute(Fabric& fabric, const Program& program, int lane,
               executor_detail::Clock::time_point deadline, const std::string& what) {
  if (program.items().empty()) return Status::ok();
  if (Status st = fabric.detached_error(); !st.is_ok()) return st.with_op(what);
  const trace::Span span(trace::kCollective, "program", program_args(program, what));
  return executor_detail::Run(fabric, program, lane, deadline, what).execute();
}

}  // namespace rdmaflow
