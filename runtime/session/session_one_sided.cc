#include "runtime/session/session_one_sided.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "runtime/session/session_dynamic.h"

namespace rdmaflow::session_detail {

namespace {

using Clock = std::chrono::steady_clock;

// The full step whose low 32 bits are `low`, nearest to `ref` (within 2^31).
int64_t widen_step(int64_t ref, uint32_t low) {
  const auto delta = static_cast<int32_t>(low - static_cast<uint32_t>(ref));
  return ref + delta;
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

uint64_t ns_since(Clock::time_point a) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count());
}

}  // namespace

Transport* OneSidedEngine::transport_for(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(transports_.size())) return nullptr;
  return transports_[static_cast<size_t>(peer)];
}

void OneSidedEngine::revoke(OutOverflow& o) {
  for (auto& [t, key] : o.keys) (void)t->revoke_key(key);
  o.keys.clear();
}

uint8_t* OneSidedEngine::slot_ptr(graph::TransferId t, uint32_t frame) const {
  const auto& s = layout_->spec(t);
  return frames_ + s.recv_slot.offset + frame * s.slot_stride;
}

uint8_t* OneSidedEngine::send_ptr(graph::TransferId t, uint32_t frame) const {
  const auto& s = layout_->spec(t);
  return frames_ + s.send_buffer.offset + frame * s.send_stride;
}

// ---------------------------------------------------------------- progress

void OneSidedEngine::progress_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      Lock lock(core_->mu);
      core_->progress_cv.wait_for(lock, Millis(50),
                                  [&] { return core_->stop || core_->events != seen; });
      if (core_->stop) return;
      seen = core_->events;
      note_channel_errors();
    }
    pump();
    send_due_credits();
  }
}

void OneSidedEngine::note_channel_errors() {
  for (size_t p = 0; p < core_->peers.size(); ++p) {
    auto& peer = core_->peers[p];
    if (!peer.channel || !peer.error.is_ok()) continue;
    Status st = peer.channel->error();
    if (!st.is_ok()) {
      peer.error = st;
      core_->cv.notify_all();
    }
  }
}

void OneSidedEngine::pump() {
  uint64_t upto;  // a listener counts an arrival after its notify is queued
  {
    Lock lock(core_->mu);
    upto = core_->arrivals;
  }
  std::vector<std::pair<int, uint64_t>> got;
  for (int p = 0; p < world_; ++p) {
    const auto& ch = core_->peers[static_cast<size_t>(p)].channel;
    if (!ch) continue;
    while (auto v = ch->inbox().poll_notify()) got.emplace_back(p, *v);
  }
  std::vector<ReadAction> reads;
  {
    Lock lock(core_->mu);
    core_->pumped = std::max(core_->pumped, upto);
    if (got.empty()) return;
    for (const auto& [p, v] : got) apply_notify(p, v, reads);
    core_->bump();
  }
  issue_reads(reads);
}

void OneSidedEngine::apply_notify(int p, uint64_t value, std::vector<ReadAction>& reads) {
  const graph::TransferId t = graph::notify_transfer(value);
  const uint32_t low = graph::notify_step(value);
  auto& peer = core_->peers[static_cast<size_t>(p)];
  if (t == kCreditTransfer) {
    peer.credited = std::max(peer.credited, widen_step(peer.credited + 1, low));
    return;
  }
  auto it = core_->in.find(t);
  if (it == core_->in.end() || it->second.peer != p) {
    peer.error = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                                "notify for transfer " + std::to_string(t) +
                                    ", which this rank does not receive from that peer");
    return;
  }
  InTransfer& in = it->second;
  const int64_t wide = widen_step(static_cast<int64_t>(in.next_arrival), low);
  if (wide < 0) {
    peer.error = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                                "notify for a step before the first one");
    return;
  }
  const auto step = static_cast<uint64_t>(wide);
  in.next_arrival = std::max(in.next_arrival, step + 1);
  const uint32_t f = layout_->frame_of(step);
  InSlot& slot = in.slots[f];
  const auto& spec = layout_->spec(t);
  if (slot.state != SlotState::kEmpty) {
    slot.state = SlotState::kFailed;
    slot.error = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                                layout_->describe(t) + " " + step_text(step) +
                                    " arrived before the slot was released (step " +
                                    std::to_string(slot.step) + " still holds it)");
    slot.step = static_cast<int64_t>(step);
    return;
  }
  slot.step = static_cast<int64_t>(step);
  uint8_t* base = slot_ptr(t, f);
  if (!spec.dynamic) {
    slot.view = RecvView{base, spec.bytes, spec.dtype, spec.shape};
    slot.state = SlotState::kReady;
    core_->stats.bytes_received += spec.bytes;
    return;
  }
  auto header = decode_dynamic_header({base, spec.meta_bytes});
  Status bad;
  if (!header) {
    bad = header.status();
  } else if (header->step != step) {
    bad = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                         "header is for step " + std::to_string(header->step));
  } else if (header->dtype != spec.dtype || header->dims.size() != spec.shape.size()) {
    bad = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                         "header dtype or rank does not match the plan");
  } else if (header->inline_payload && header->bytes > spec.recv_slot.size - spec.meta_bytes) {
    bad = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p, "inline payload overflows the slot");
  }
  if (!bad.is_ok()) {
    slot.state = SlotState::kFailed;
    slot.error = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                                layout_->describe(t) + " " + step_text(step) + ": " + bad.reason());
    return;
  }
  slot.view = RecvView{base + spec.meta_bytes, header->bytes, header->dtype, header->dims};
  if (header->inline_payload) {
    slot.state = SlotState::kReady;
    core_->stats.bytes_received += header->bytes;
    return;
  }
  // Metadata, then read: the payload stays on the sender until this rank reads it.
  if (!slot.overflow || slot.overflow->capacity < header->bytes) {
    if (slot.overflow) (void)arena_->free(*slot.overflow);
    slot.overflow.reset();
    auto a = arena_->allocate(header->bytes);
    if (!a) {
      slot.state = SlotState::kFailed;
      slot.error = a.status().with_op("receive " + layout_->describe(t) + " " + step_text(step));
      return;
    }
    slot.overflow = *a;
  }
  // The key for this peer's channel (one per transport when readers differ).
  const std::string backend = peer.channel->backend();
  const RemoteKey* key = &*header->key;
  for (const auto& k : header->more_keys) {
    if (key->backend != backend && k.backend == backend) key = &k;
  }
  if (key->backend != backend) {
    slot.state = SlotState::kFailed;
    slot.error = RDMAFLOW_ERROR(Code::kProtocolError, "receive", p,
                                layout_->describe(t) + " " + step_text(step) +
                                    ": the header has no key for a " + backend + " channel");
    return;
  }
  slot.view.data = slot.overflow->ptr;
  slot.state = SlotState::kReading;
  core_->pending[f].push_back({t, p, "read of a dynamic payload"});
  reads.push_back({t, step, p, slot.overflow->ptr, header->bytes, *key});
}

void OneSidedEngine::issue_reads(std::vector<ReadAction>& reads) {
  for (auto& r : reads) {
    const uint32_t f = layout_->frame_of(r.step);
    std::weak_ptr<Core> weak = core_;
    auto done = [weak, t = r.t, step = r.step, f, peer = r.peer, bytes = r.bytes,
                 what = layout_->describe(r.t)](const Status& st) {
      auto core = weak.lock();
      if (!core) return;
      std::lock_guard<std::mutex> lock(core->mu);
      auto& pend = core->pending[f];
      auto it = std::find_if(pend.begin(), pend.end(),
                             [&](const Pending& x) { return x.transfer == t && x.peer == peer; });
      if (it != pend.end()) pend.erase(it);
      auto& slot = core->in.at(t).slots[f];
      if (slot.step == static_cast<int64_t>(step) && slot.state == SlotState::kReading) {
        if (st.is_ok()) {
          slot.state = SlotState::kReady;
          core->stats.bytes_received += bytes;
          ++core->stats.reads;
        } else {
          slot.state = SlotState::kFailed;
          slot.error = st.with_op("read " + what + " " + step_text(step));
        }
        if (core->last_ended && *core->last_ended >= step) {  // nobody will take it now
          slot.state = SlotState::kEmpty;
          slot.step = -1;
        }
      }
      core->bump();
    };
    auto& ch = core_->peers[static_cast<size_t>(r.peer)].channel;
    ch->read(r.dst, r.bytes, r.key, 0, std::move(done), timeout_);
  }
  reads.clear();
}

void OneSidedEngine::send_due_credits() {
  // One thread at a time, so credits leave in step order.
  std::lock_guard<std::mutex> serial(credit_mu_);
  std::vector<uint64_t> steps;
  {
    Lock lock(core_->mu);
    if (!core_->last_ended) return;
    while (core_->next_credit <= *core_->last_ended &&
           core_->pending[layout_->frame_of(core_->next_credit)].empty()) {
      steps.push_back(core_->next_credit++);
    }
    core_->credits_in_flight += steps.size() * layout_->senders.size();
  }
  auto* ctrl = static_cast<uint8_t*>(ctrl_alloc_.ptr);
  for (uint64_t step : steps) {
    for (int p : layout_->senders) {
      auto* src = ctrl + (static_cast<size_t>(world_) + static_cast<size_t>(p)) * kCtrlStride;
      std::memcpy(src, &step, 8);
      std::weak_ptr<Core> weak = core_;
      auto done = [weak, p, step](const Status& st) {
        auto core = weak.lock();
        if (!core) return;
        std::lock_guard<std::mutex> lock(core->mu);
        --core->credits_in_flight;
        auto& peer = core->peers[static_cast<size_t>(p)];
        if (!st.is_ok() && peer.error.is_ok()) {
          peer.error = st.with_op("send credit for " + step_text(step));
        }
        if (st.is_ok()) ++core->stats.credits_sent;
        core->bump();
      };
      auto& peer = core_->peers[static_cast<size_t>(p)];
      peer.channel->write(src, 8, *peer.credit_key, 0, graph::make_notify(kCreditTransfer, step),
                          std::move(done), timeout_);
    }
  }
}

Callback OneSidedEngine::op_callback(uint32_t frame, Pending who, uint64_t bytes_on_success) {
  std::weak_ptr<Core> weak = core_;
  return [weak, frame, who, bytes_on_success](const Status& st) {
    auto core = weak.lock();
    if (!core) return;
    std::lock_guard<std::mutex> lock(core->mu);
    auto& pend = core->pending[frame];
    auto it = std::find_if(pend.begin(), pend.end(), [&](const Pending& x) {
      return x.transfer == who.transfer && x.peer == who.peer;
    });
    if (it != pend.end()) pend.erase(it);
    auto& peer = core->peers[static_cast<size_t>(who.peer)];
    if (st.is_ok()) {
      core->stats.bytes_sent += bytes_on_success;
      ++core->stats.writes;
    } else if (peer.error.is_ok()) {
      peer.error = st.with_op(std::string("write of transfer ") + std::to_string(who.transfer));
    }
    core->bump();
  };
}

template <typename Pred>
bool OneSidedEngine::wait(Lock& lock, Deadline deadline, int peer, Pred ready) {
  // Waiting for one peer: drive that peer's transport on this thread (its
  // WaitDriver), so the notify reaches this thread when it lands, with no hop
  // through the transport's progress thread and a condition variable; under
  // load each hop is a wake-up that waits for a core.
  std::shared_ptr<WaitDriver> driver;
  if (peer >= 0) {
    const auto& ch = core_->peers[static_cast<size_t>(peer)].channel;
    if (ch) driver = ch->inbox().wait_driver();
  }
  // While this thread waits the progress thread sleeps; whatever arrived after
  // this thread's last pump is its again when the last waiter leaves.
  ++core_->waiting;
  struct Leave {
    Core& core;
    ~Leave() {
      if (--core.waiting == 0 && core.arrivals != core.pumped) core.progress_cv.notify_one();
    }
  } leave{*core_};
  for (;;) {
    note_channel_errors();
    if (ready()) return true;
    if (peer >= 0 && !core_->peers[static_cast<size_t>(peer)].error.is_ok()) return false;
    if (Clock::now() >= deadline) return false;
    const uint64_t seen = core_->events;
    lock.unlock();
    // A waiting thread makes progress itself (no hop through the session's
    // progress thread): it takes the notifies and sends the credits due.
    pump();
    send_due_credits();
    bool moved = false;
    if (driver) {
      moved = driver->drive(
          [&] {
            std::lock_guard<std::mutex> g(core_->mu);
            return core_->events != seen || ready();
          },
          std::min(deadline, Clock::now() + Millis(50)));
      if (moved) pump();
    }
    lock.lock();
    if (ready()) return true;
    if (moved) continue;
    core_->cv.wait_until(lock, std::min(deadline, Clock::now() + Millis(50)),
                         [&] { return core_->events != seen || ready(); });
  }
}

// ---------------------------------------------------------------- steps

Status OneSidedEngine::begin_step(uint64_t step) {
  const uint32_t f = layout_->frame_of(step);
  Lock lock(core_->mu);
  if (!core_->first_step) {
    core_->first_step = step;
    core_->next_credit = step;
    for (auto& [t, in] : core_->in) in.next_arrival = std::max(in.next_arrival, step);
    for (auto& peer : core_->peers) {
      peer.credited = std::max(peer.credited, static_cast<int64_t>(step) - 1);
    }
  }
  const auto deadline = Clock::now() + timeout_;
  if (!wait(lock, deadline, -1, [&] { return core_->pending[f].empty(); })) {
    const Pending& p = core_->pending[f].front();
    return RDMAFLOW_ERROR(Code::kTimeout, "begin step", p.peer,
                          step_text(step) + ": the " + p.what + " of " +
                              layout_->describe(p.transfer) + " from " +
                              step_text(step - layout_->copies) + " has not completed within " +
                              std::to_string(timeout_.count()) + " ms");
  }
  return Status::ok();
}

bool OneSidedEngine::wait_for_credit(Lock& lock, int peer, int64_t need) {
  const Peer& p = core_->peers[static_cast<size_t>(peer)];
  if (p.credited >= need) return true;
  ++core_->stats.credit_stalls;
  const auto t0 = Clock::now();
  const bool ok = wait(lock, t0 + timeout_, peer, [&] { return p.credited >= need; });
  core_->stats.credit_wait_ms += ms_between(t0, Clock::now());
  if (p.channel) p.channel->counters().add_credit_stall(ns_since(t0));
  return ok;
}

Result<SessionBuffer> OneSidedEngine::overflow_buffer(size_t output_index, uint64_t step,
                                                      size_t bytes) {
  const uint32_t f = layout_->frame_of(step);
  const auto& buffer = layout_->me->buffers[output_index];
  // The readers of step - copies may still be reading this buffer: wait for
  // their credits, which come after their reads completed.
  if (step >= *core_->first_step + layout_->copies) {
    const int64_t need = static_cast<int64_t>(step - layout_->copies);
    for (graph::TransferId t : buffer.transfers) {
      const int p = layout_->spec(t).dst_rank;
      Lock lock(core_->mu);
      if (!wait_for_credit(lock, p, need)) {
        const Status& err = core_->peers[static_cast<size_t>(p)].error;
        if (!err.is_ok()) return err;
        return RDMAFLOW_ERROR(Code::kTimeout, "allocate output", p,
                              layout_->describe(t) + " " + step_text(step) +
                                  ": the receiver has not released " + step_text(need) +
                                  " within " + std::to_string(timeout_.count()) + " ms");
      }
    }
  }
  auto& o = out_overflow_[{output_index, f}];
  if (!o.alloc || o.alloc->capacity < bytes) {
    if (o.alloc) {
      revoke(o);
      (void)arena_->free(*o.alloc);
      o.alloc.reset();
    }
    RDMAFLOW_ASSIGN_OR_RETURN(Allocation a, arena_->allocate(bytes));
    // Every receiver reads it through its own channel's transport: one key each.
    for (graph::TransferId t : buffer.transfers) {
      Transport* tr = transport_for(layout_->spec(t).dst_rank);
      if (std::any_of(o.keys.begin(), o.keys.end(), [&](const auto& k) { return k.first == tr; })) {
        continue;
      }
      auto key = tr->export_key(a.ptr, a.capacity);
      if (!key) {
        revoke(o);
        (void)arena_->free(a);
        return key.status();
      }
      o.keys.emplace_back(tr, std::move(*key));
    }
    o.alloc = a;
  }
  return SessionBuffer{o.alloc->ptr, o.alloc->capacity};
}

Status OneSidedEngine::send(graph::TransferId t, uint64_t step, const void* payload, size_t bytes,
                            const std::vector<int64_t>& dims) {
  const OutTransfer& o = out_.at(t);
  const auto& spec = layout_->spec(t);
  const uint32_t f = layout_->frame_of(step);
  Lock lock(core_->mu);
  Peer& peer = core_->peers[static_cast<size_t>(o.peer)];
  if (!peer.error.is_ok()) return peer.error.with_op("send " + layout_->describe(t));
  // Flow control: the receiver must have finished step - copies, whose data
  // this write replaces.
  if (step >= *core_->first_step + layout_->copies) {
    const int64_t need = static_cast<int64_t>(step - layout_->copies);
    if (!wait_for_credit(lock, o.peer, need)) {
      if (!peer.error.is_ok()) return peer.error.with_op("send " + layout_->describe(t));
      return RDMAFLOW_ERROR(Code::kTimeout, "send", o.peer,
                            layout_->describe(t) + " " + step_text(step) +
                                ": the receiver has not released " + step_text(need) + " within " +
                                std::to_string(timeout_.count()) + " ms");
    }
  }
  const uint8_t* src = static_cast<const uint8_t*>(payload);
  size_t len = bytes;
  if (spec.dynamic) {
    uint8_t* base = send_ptr(t, f);
    const bool inline_payload = payload == base + spec.meta_bytes;
    int64_t& written = header_step_[o.output_index * layout_->copies + f];
    if (written != static_cast<int64_t>(step)) {  // once per output, however many receivers
      DynamicHeader h;
      h.dtype = spec.dtype;
      h.inline_payload = inline_payload;
      h.step = step;
      h.bytes = bytes;
      h.dims = dims;
      if (!inline_payload) {
        for (const auto& [tr, key] : out_overflow_.at({o.output_index, f}).keys) {
          if (!h.key) {
            h.key = key;
          } else {
            h.more_keys.push_back(key);
          }
        }
      }
      RDMAFLOW_RETURN_IF_ERROR(encode_dynamic_header(h, {base, spec.meta_bytes})
                                   .with_op("send " + layout_->describe(t)));
      written = static_cast<int64_t>(step);
    }
    src = base;
    len = inline_payload ? spec.meta_bytes + bytes : spec.meta_bytes;
  }
  core_->pending[f].push_back({t, o.peer, "write"});
  lock.unlock();
  peer.channel->write(src, len, o.slot_keys[f], 0, graph::make_notify(t, step),
                      op_callback(f, {t, o.peer, "write"}, bytes), timeout_);
  return Status::ok();
}

Result<RecvView> OneSidedEngine::recv(graph::TransferId t, uint64_t step) {
  const uint32_t f = layout_->frame_of(step);
  Lock lock(core_->mu);
  InTransfer& in = core_->in.at(t);
  InSlot& slot = in.slots[f];
  const auto t0 = Clock::now();
  bool ok = wait(lock, t0 + timeout_, in.peer, [&] {
    return slot.step == static_cast<int64_t>(step) &&
           (slot.state == SlotState::kReady || slot.state == SlotState::kFailed);
  });
  core_->stats.recv_wait_ms += ms_between(t0, Clock::now());
  if (auto& ch = core_->peers[static_cast<size_t>(in.peer)].channel) {
    ch->counters().add_wait_ns(ns_since(t0));
  }
  if (ok && slot.state == SlotState::kReady) return slot.view;
  if (ok) return slot.error;
  const Status& err = core_->peers[static_cast<size_t>(in.peer)].error;
  if (!err.is_ok()) return err.with_op("recv " + layout_->describe(t) + " " + step_text(step));
  return RDMAFLOW_ERROR(Code::kTimeout, "recv", in.peer,
                        layout_->describe(t) + " " + step_text(step) + ": no data within " +
                            std::to_string(timeout_.count()) + " ms");
}

Status OneSidedEngine::end_step(uint64_t step) {
  const uint32_t f = layout_->frame_of(step);
  {
    Lock lock(core_->mu);
    for (auto& [t, in] : core_->in) {
      InSlot& slot = in.slots[f];
      if (slot.step == static_cast<int64_t>(step) && slot.state != SlotState::kReading) {
        slot.state = SlotState::kEmpty;
        slot.step = -1;
      }
    }
    core_->last_ended = step;
    ++core_->stats.steps;
  }
  send_due_credits();
  return Status::ok();
}

Status OneSidedEngine::finish(const AllGather& allgather) {
  Status first;
  if (core_->first_step) {
    send_due_credits();
    Lock lock(core_->mu);
    const auto deadline = Clock::now() + timeout_;
    auto drained = [&] {
      if (core_->credits_in_flight) return false;
      if (core_->last_ended && core_->next_credit <= *core_->last_ended) return false;
      for (const auto& p : core_->pending)
        if (!p.empty()) return false;
      return true;
    };
    for (;;) {
      if (wait(lock, std::min(deadline, Clock::now() + Millis(20)), -1, drained)) break;
      if (Clock::now() >= deadline) {
        first = RDMAFLOW_ERROR(Code::kTimeout, "finish session", -1,
                               "writes, reads or credits still in flight after " +
                                   std::to_string(timeout_.count()) + " ms");
        break;
      }
      lock.unlock();
      send_due_credits();  // a read that just completed may free a credit
      lock.lock();
    }
    for (const auto& peer : core_->peers) {
      if (first.is_ok() && !peer.error.is_ok()) first = peer.error;
    }
  }
  // Meet every rank, so no channel closes while a peer still writes to it.
  auto met = allgather(Bytes{first.is_ok() ? uint8_t{1} : uint8_t{0}});
  if (first.is_ok() && !met) first = met.status().with_op("finish session");
  {
    Lock lock(core_->mu);
    core_->stop = true;
    core_->bump();
  }
  if (progress_.joinable()) progress_.join();
  return first;
}

void OneSidedEngine::add_stats(SessionStats& stats) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  const SessionStats& s = core_->stats;
  stats.steps = s.steps;
  stats.bytes_sent += s.bytes_sent;
  stats.bytes_received += s.bytes_received;
  stats.writes += s.writes;
  stats.reads += s.reads;
  stats.credits_sent += s.credits_sent;
  stats.credit_stalls += s.credit_stalls;
  stats.recv_wait_ms += s.recv_wait_ms;
  stats.credit_wait_ms += s.credit_wait_ms;
}

}  // namespace rdmaflow::session_detail
