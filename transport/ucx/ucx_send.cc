// UcxChannel, sending side (progress context): the send queue, writes and reads on
// the rma, am and direct paths, ordering behind puts (endpoint flushes), key
// resolution, control messages and acknowledgements, and publishing notifies in
// the peer's notify ring.
#include "transport/ucx/ucx_channel.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "transport/shm/peer_process.h"

namespace rdmaflow::ucx {

namespace {

ucp_request_param_t send_param(ucp_send_nbx_callback_t cb, void* user, uint32_t flags = 0) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (flags != 0) p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = cb;
  p.user_data = user;
  p.flags = flags;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------
// Send queue and ordering

void UcxChannel::enqueue(Op* op) {
  if (failed()) {
    core_->complete(op, error_.for_op(op->name()));
    return;
  }
  core_->add_ref(op);  // the queue's
  op->qnext = nullptr;
  (q_tail_ ? q_tail_->qnext : q_head_) = op;
  q_tail_ = op;
  core_->mark_dirty(this);
}

void UcxChannel::pump() {
  while (q_head_ != nullptr && !failed()) {
    Op* op = q_head_;
    const Step step = post(op);
    if (failed()) return;  // fail() emptied the queue, this op included
    if (step == Step::kStall) return;
    q_head_ = op->qnext;
    if (q_head_ == nullptr) q_tail_ = nullptr;
    op->qnext = nullptr;
    core_->release(op);
  }
}

UcxChannel::Step UcxChannel::post(Op* op) {
  if (op->completed && op->kind != OpKind::kRevokeAck) return Step::kPosted;  // timed out
  switch (op->kind) {
    case OpKind::kMessage:
      if (!ordered_ready()) return Step::kStall;
      op->hdr = AmHeader{};
      op->hdr.type = static_cast<uint8_t>(MsgType::kMessage);
      op->hdr.channel = remote_id_;
      op->hdr.seq = tx_seq_++;
      op->parts = 1;
      post_am(op, op->bytes.data(), op->bytes.size(), 0);
      return Step::kPosted;
    case OpKind::kWrite:
      return post_write(op);
    case OpKind::kRead:
      return post_read(op);
    case OpKind::kRevokeAck:
      if (!ordered_ready()) return Step::kStall;
      op->hdr.type = static_cast<uint8_t>(MsgType::kRevokeAck);
      op->hdr.channel = remote_id_;
      post_am(op, nullptr, 0, 0);
      return Step::kPosted;
    case OpKind::kCtrl:
      break;
  }
  return Step::kPosted;
}

bool UcxChannel::ordered_ready() {
  if ((unflushed_ > 0 || force_flush_) && flush_ == nullptr) {
    force_flush_ = false;
    issue_flush();
    if (failed()) return false;
  }
  return unflushed_ == 0 && !force_flush_ && flush_ == nullptr;
}

void UcxChannel::issue_flush() {
  auto* ctx = new FlushCtx{this, std::move(flush_waiters_), std::move(retired_rkeys_)};
  flush_waiters_.clear();
  retired_rkeys_.clear();
  unflushed_ = 0;
  flush_ = ctx;
  ucp_request_param_t p = send_param(&UcxChannel::on_flush, ctx);
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep_, &p);
  if (r == nullptr) {
    on_flush_done(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    on_flush_done(ctx, UCS_PTR_STATUS(r));
  } else {
    note_request();
  }
}

void UcxChannel::on_flush(void* request, ucs_status_t status, void* user) {
  ucp_request_free(request);
  auto* ctx = static_cast<FlushCtx*>(user);
  --ctx->ch->requests_inflight_;
  ctx->ch->on_flush_done(ctx, status);
}

void UcxChannel::on_flush_done(FlushCtx* ctx, ucs_status_t status) {
  if (flush_ == ctx) flush_ = nullptr;
  const Status st = status == UCS_OK ? Status::ok() : ucs_error("write", status);
  for (Op* op : ctx->ops) {
    core_->part_done(op, st);
    core_->release(op);
  }
  for (ucp_rkey_h k : ctx->rkeys) ucp_rkey_destroy(k);
  delete ctx;
  if (failed()) return;
  if (status != UCS_OK) return fail(st);
  if (!flush_waiters_.empty() || !retired_rkeys_.empty()) issue_flush();
  core_->mark_dirty(this);
}

// ---------------------------------------------------------------------------
// Active messages

bool UcxChannel::post_am(Op* op, const void* data, size_t len, uint32_t am_flags) {
  ucp_request_param_t p = send_param(&UcxChannel::on_send, op, am_flags);
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ep_, kAmId, &op->hdr, sizeof(AmHeader), len > 0 ? data : nullptr, len, &p);
  if (r == nullptr) {
    core_->part_done(op, Status::ok());
    return true;
  }
  if (UCS_PTR_IS_ERR(r)) {
    const Status st = ucs_error(op->name(), UCS_PTR_STATUS(r));
    core_->complete(op, st);
    fail(st);
    return false;
  }
  core_->add_ref(op);  // the UCP request's
  note_request();
  return true;
}

void UcxChannel::on_send(void* request, ucs_status_t status, void* user) {
  ucp_request_free(request);
  auto* op = static_cast<Op*>(user);
  UcxChannel* ch = op->ch;
  --ch->requests_inflight_;
  ch->core_->part_done(op, status == UCS_OK ? Status::ok() : ch->ucs_error(op->name(), status));
  ch->core_->release(op);
}

void UcxChannel::send_ctrl(MsgType type, uint64_t id, std::vector<uint8_t> data, uint16_t code,
                           uint64_t value, uint64_t length) {
  AmHeader h;
  h.type = static_cast<uint8_t>(type);
  h.code = code;
  h.channel = type == MsgType::kHello ? 0 : remote_id_;
  h.id = id;
  h.value = value;
  h.length = length;
  post_ctrl(h, std::move(data));
}

void UcxChannel::post_ctrl(const AmHeader& h, std::vector<uint8_t> data) {
  if (failed() || ep_ == nullptr) return;
  Op* op = core_->ctrl_op(this);
  op->hdr = h;
  op->bytes = std::move(data);
  core_->add_ref(op);
  post_am(op, op->bytes.data(), op->bytes.size(), 0);
  core_->release(op);
}

void UcxChannel::flush_acks() {
  if (!ack_needed_ || ack_held || failed()) return;
  AmHeader h;
  h.type = static_cast<uint8_t>(MsgType::kAck);
  h.channel = remote_id_;
  h.offset = ack_from_;
  h.length = rx_next_;
  post_ctrl(h, std::move(ack_refusals_));
  ack_refusals_.clear();
  ack_from_ = rx_next_;
  ack_needed_ = false;
}

// ---------------------------------------------------------------------------
// Keys

UcxChannel::KeyEntry* UcxChannel::resolve_key(Op* op, Status* refusal) {
  auto it = keys_.find(op->key_id);
  if (it == keys_.end()) {
    if (op->blob.empty()) {
      // The issuing thread saw the key as known, and it has since been revoked.
      *refusal =
          RDMAFLOW_ERROR(Code::kNotFound, op->name(), peer_,
                         "key id " + std::to_string(op->key_id) + " was revoked by the peer");
      return nullptr;
    }
    query_key(keys_[op->key_id], op);
    return nullptr;
  }
  KeyEntry& e = it->second;
  if (e.state == KeyEntry::State::kQuerying) return nullptr;
  if (e.state == KeyEntry::State::kRefused &&
      (op->key_secret != e.secret || (!op->blob.empty() && op->blob != e.blob))) {
    // Refused for another secret or rkey (say, a forged copy): ask about this one.
    query_key(e, op);
    return nullptr;
  }
  if (op->key_secret != e.secret) {
    *refusal = RDMAFLOW_ERROR(
        Code::kNotFound, op->name(), peer_,
        "wrong secret for key id " + std::to_string(op->key_id) + " (forged or stale key)");
    return nullptr;
  }
  if (e.state == KeyEntry::State::kRefused) {
    *refusal = e.refusal.with_op(op->name());
    return nullptr;
  }
  // Bounds against the grant the owner confirmed, not the one the key claims.
  const uint64_t start = op->key_addr + op->offset;
  if (start < e.addr || start - e.addr > e.length || op->len > e.length - (start - e.addr)) {
    *refusal =
        RDMAFLOW_ERROR(Code::kOutOfRange, op->name(), peer_,
                       "offset " + std::to_string(op->offset) + " + length " +
                           std::to_string(op->len) + " exceeds the " + std::to_string(e.length) +
                           " bytes the peer granted by key id " + std::to_string(op->key_id));
    return nullptr;
  }
  return &e;
}

void UcxChannel::query_key(KeyEntry& e, const Op* op) {
  // One round trip per key and channel: the owner confirms the grant before the
  // first put/get, since UCX rkeys cover the whole slab and cannot be revoked.
  e.state = KeyEntry::State::kQuerying;
  e.secret = op->key_secret;
  if (!op->blob.empty()) e.blob = op->blob;
  AmHeader h;
  h.type = static_cast<uint8_t>(MsgType::kKeyQuery);
  h.channel = remote_id_;
  h.id = op->key_id;
  h.key_id = op->key_id;
  h.secret = op->key_secret;
  post_ctrl(h, {});
}

void UcxChannel::revoked(uint64_t round, const std::vector<uint64_t>& key_ids) {
  for (uint64_t id : key_ids) {
    auto it = keys_.find(id);
    if (it == keys_.end()) continue;
    if (it->second.rkey != nullptr) retired_rkeys_.push_back(it->second.rkey);
    if (it->second.region != 0) unref_region(it->second.region);  // no copy is in flight
    keys_.erase(it);  // a later use queries the owner again, who refuses it
  }
  {
    std::lock_guard<std::mutex> lock(known_mu_);
    for (uint64_t id : key_ids) known_keys_.erase(id);
  }
  // Confirm once every put/get issued with those keys so far has completed.
  force_flush_ = true;
  Op* ack = core_->ctrl_op(this);
  ack->kind = OpKind::kRevokeAck;
  ack->hdr.id = round;
  enqueue(ack);
}

// ---------------------------------------------------------------------------
// Writes and reads

UcxChannel::Step UcxChannel::post_write(Op* op) {
  if (!op->put_path) {
    // The whole write is one AM; the receiver checks the key and places the bytes.
    if (!ordered_ready()) return Step::kStall;
    op->seq = tx_seq_++;
    op->hdr = AmHeader{};
    op->hdr.type = static_cast<uint8_t>(MsgType::kWrite);
    op->hdr.flags = op->has_notify ? kFlagNotify : 0;
    op->hdr.channel = remote_id_;
    op->hdr.seq = op->seq;
    op->hdr.key_id = op->key_id;
    op->hdr.secret = op->key_secret;
    op->hdr.offset = op->offset;
    op->hdr.length = op->len;
    op->hdr.value = op->notify;
    op->parts = 2;  // sent + acknowledged
    awaiting_ack_.push_back(op);
    core_->add_ref(op);
    if (direct_ && op->len > 0) ++am_writes_inflight_;  // empty writes touch no memory
    post_am(op, op->src, op->len, 0);
    return Step::kPosted;
  }
  if (!op->notify_stage) {
    Status refusal;
    KeyEntry* k = resolve_key(op, &refusal);
    if (!refusal.is_ok()) {
      core_->complete(op, std::move(refusal));
      return Step::kPosted;
    }
    if (k == nullptr) return Step::kStall;  // waiting for the owner to confirm the key
    if (direct_) {
      uint64_t at = 0;
      const shm::PeerMemory* target = direct_memory(*k, op, &at);
      if (target == nullptr) {  // not in the peer's shared pages: the receiver places it
        op->put_path = false;
        return post_write(op);
      }
      // An earlier write still travelling as an AM must not land after this copy.
      if (am_writes_inflight_ > 0) return Step::kStall;
      if (!copy_direct(op, *target, at, true)) return Step::kPosted;  // op completed, failed
      if (!op->has_notify) {
        core_->complete(op, Status::ok());  // the bytes are in the peer's memory
        return Step::kPosted;
      }
      // The notify (ring entry or AM) is published after the bytes: the ring's tail
      // is stored with release order, and UCX's shared-memory FIFO orders its element
      // after earlier stores (the fence makes it explicit).
      std::atomic_thread_fence(std::memory_order_release);
      op->parts = 2;  // notify sent + acknowledged (AM), or published (ring)
      op->notify_stage = true;
      return post_write(op);
    }
    op->parts = op->has_notify ? 3 : 2;  // put + (notify sent + acknowledged | flush)
    ucp_request_param_t p = send_param(&UcxChannel::on_send, op);
    ucs_status_ptr_t r = ucp_put_nbx(ep_, op->src, op->len, op->key_addr + op->offset, k->rkey, &p);
    if (r == nullptr) {
      core_->part_done(op, Status::ok());
    } else if (UCS_PTR_IS_ERR(r)) {
      const Status st = ucs_error("write", UCS_PTR_STATUS(r));
      core_->complete(op, st);
      fail(st);
      return Step::kPosted;
    } else {
      core_->add_ref(op);
      note_request();
    }
    ++unflushed_;
    if (!op->has_notify) {
      flush_waiters_.push_back(op);
      core_->add_ref(op);
      if (flush_ == nullptr) issue_flush();
      return Step::kPosted;
    }
    op->notify_stage = true;
  }
  // The notify may only leave once the put is complete at the target.
  if (!ordered_ready()) return Step::kStall;
  if (direct_ && tx_ring_ != nullptr && publish_ring(op)) {
    core_->complete(op, Status::ok());  // bytes in the peer's memory, notify published
    return Step::kPosted;
  }
  op->seq = tx_seq_++;
  op->hdr = AmHeader{};
  op->hdr.type = static_cast<uint8_t>(MsgType::kNotify);
  op->hdr.flags = kFlagNotify;
  op->hdr.channel = remote_id_;
  op->hdr.seq = op->seq;
  op->hdr.key_id = op->key_id;
  op->hdr.secret = op->key_secret;
  op->hdr.offset = op->offset;
  op->hdr.length = op->len;
  op->hdr.value = op->notify;
  awaiting_ack_.push_back(op);
  core_->add_ref(op);
  post_am(op, nullptr, 0, 0);
  return Step::kPosted;
}

UcxChannel::Step UcxChannel::post_read(Op* op) {
  if (!op->put_path) {
    op->hdr = AmHeader{};
    op->hdr.type = static_cast<uint8_t>(MsgType::kReadReq);
    op->hdr.channel = remote_id_;
    op->hdr.id = op->id;
    op->hdr.key_id = op->key_id;
    op->hdr.secret = op->key_secret;
    op->hdr.offset = op->offset;
    op->hdr.length = op->len;
    op->parts = 2;  // request sent + response received
    reads_.emplace(op->id, op);
    core_->add_ref(op);
    post_am(op, nullptr, 0, 0);
    return Step::kPosted;
  }
  Status refusal;
  KeyEntry* k = resolve_key(op, &refusal);
  if (!refusal.is_ok()) {
    core_->complete(op, std::move(refusal));
    return Step::kPosted;
  }
  if (k == nullptr) return Step::kStall;
  if (direct_) {
    uint64_t at = 0;
    const shm::PeerMemory* source = direct_memory(*k, op, &at);
    if (source == nullptr) {  // not in the peer's shared pages: the owner answers a request
      op->put_path = false;
      return post_read(op);
    }
    if (!copy_direct(op, *source, at, false)) return Step::kPosted;  // op completed, failed
    core_->complete(op, Status::ok());
    return Step::kPosted;
  }
  op->parts = 1;
  ucp_request_param_t p = send_param(&UcxChannel::on_send, op);
  ucs_status_ptr_t r = ucp_get_nbx(ep_, op->dst, op->len, op->key_addr + op->offset, k->rkey, &p);
  if (r == nullptr) {
    core_->part_done(op, Status::ok());
  } else if (UCS_PTR_IS_ERR(r)) {
    const Status st = ucs_error("read", UCS_PTR_STATUS(r));
    core_->complete(op, st);
    fail(st);
  } else {
    core_->add_ref(op);
    note_request();
  }
  return Step::kPosted;
}

// ---------------------------------------------------------------------------
// Direct path: copies into the peer's shared pages, notifies into its ring

const shm::PeerMemory* UcxChannel::direct_memory(const KeyEntry& e, const Op* op,
                                                 uint64_t* at) const {
  if (e.region == 0) return nullptr;
  // resolve_key checked [key_addr + offset, + len) against the grant; the peer shared
  // the whole pages of the grant's region, which may leave out its ragged ends.
  const Mapping& m = maps_.at(e.region);
  const uint64_t start = op->key_addr + op->offset;
  if (start < m.remote_base || !m.memory.covers(start - m.remote_base, op->len)) return nullptr;
  *at = start - m.remote_base;
  return &m.memory;
}

bool UcxChannel::copy_direct(Op* op, const shm::PeerMemory& memory, uint64_t at, bool to_peer) {
  // 4 MiB is about half a millisecond of copying: one poll() per slice costs under
  // 0.1%, and a peer that dies mid-transfer is noticed within a slice instead of
  // after the whole queue went into memory nobody will read.
  constexpr size_t kLivenessBytes = size_t{4} << 20;
  const auto* src = static_cast<const uint8_t*>(op->src);
  auto* dst = static_cast<uint8_t*>(op->dst);
  for (size_t done = 0; done < op->len;) {
    if (copied_since_check_ >= kLivenessBytes) {
      copied_since_check_ = 0;
      if (shm::peer_exited(pidfd_)) {
        peer_exited();  // fails the channel, and op with it
        return false;
      }
    }
    const size_t n = std::min(op->len - done, kLivenessBytes - copied_since_check_);
    Status st =
        to_peer ? memory.put(at + done, src + done, n) : memory.get(at + done, dst + done, n);
    if (!st.is_ok()) {  // direct_memory() checked the range: a bug, but never a stray write
      core_->complete(op, std::move(st));
      return false;
    }
    done += n;
    copied_since_check_ += n;
  }
  return true;
}

bool UcxChannel::publish_ring(Op* op) {
  shm::RingHeader* h = tx_ring_->header();
  const uint64_t head = h->head.load(std::memory_order_acquire);
  // Full (or a head we never wrote up to): the notify takes the ordered AM, which
  // the receiver applies after every ring entry before it (one sequence for both).
  if (tx_tail_ - head >= tx_ring_->slots()) return false;
  shm::RingSlot* slot = tx_ring_->slot(tx_tail_);
  op->seq = tx_seq_++;
  slot->seq = op->seq;
  slot->key_id = op->key_id;
  slot->secret = op->key_secret;
  slot->offset = op->offset;
  slot->length = op->len;
  slot->notify = op->notify;
  // Release: the receiver that sees the new tail sees the slot and the payload
  // copied before it.
  h->tail.store(++tx_tail_, std::memory_order_release);
  // Producer half of the sleep protocol: tail store, full fence, sleepers load. The
  // consumer increments sleepers, then rereads the tail; one of us sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The wake-up is a write to the receiver's eventfd: the kernel runs its sleeper
  // at once, where a message would need UCX's own signalling first.
  if (h->sleepers.load(std::memory_order_seq_cst) != 0 && !tx_ring_->wake()) {
    send_ctrl(MsgType::kRingWake, 0, {});
  }
  return true;
}

}  // namespace rdmaflow::ucx
