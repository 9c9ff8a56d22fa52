#include "transport/ucx/ucx_channel.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "transport/shm/shared_pages.h"

namespace rdmaflow::ucx {

namespace {

Code wire_code(uint16_t code) {
  if (code == 0 || code > static_cast<uint16_t>(Code::kInternal)) return Code::kInternal;
  return static_cast<Code>(code);
}

ucp_request_param_t send_param(ucp_send_nbx_callback_t cb, void* user, uint32_t flags = 0) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (flags != 0) p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = cb;
  p.user_data = user;
  p.flags = flags;
  return p;
}

std::string text(const void* data, size_t length, bool rndv) {
  if (rndv || data == nullptr) return "";
  return std::string(static_cast<const char*>(data), std::min(length, kMaxReason));
}

}  // namespace

UcxChannel::UcxChannel(std::shared_ptr<UcxCore> core, uint32_t id, int peer_rank,
                       const ProcessIdentity& peer)
    : core_(std::move(core)), id_(id), peer_(peer_rank), peer_identity_(peer) {
  inbox_.set_peer(peer_rank);
  const Options& o = core_->options();
  if (o.busy_poll || o.wait_spin.count() > 0 || o.wait_block) inbox_.set_wait_driver(core_);
}

UcxChannel::~UcxChannel() {
  if (pidfd_ >= 0) ::close(pidfd_);
  for (auto& [seq, item] : rx_held_) delete item;
}

Status UcxChannel::error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

// ---------------------------------------------------------------------------
// Issuing threads

Op* UcxChannel::issue(OpKind kind, Callback done, Millis timeout) {
  const Options& o = core_->options();
  if (done && (o.busy_poll || o.wait_spin.count() > 0 || o.wait_block))
    attach_wait_driver(done, core_);
  return core_->new_op(kind, this, std::move(done), timeout);
}

Status UcxChannel::check_key(const RemoteKey& key, uint64_t offset, uint64_t len,
                             const char* op) const {
  if (key.backend != "ucx") {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_,
                          "remote key belongs to backend '" + key.backend + "', not ucx");
  }
  // UCX rkeys grant the whole registered slab: the grant's bounds are enforced here.
  if (!key.covers(offset, len)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer_,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(key.length) +
                              " bytes granted by key id " + std::to_string(key.key_id));
  }
  return Status::ok();
}

void UcxChannel::write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                       std::optional<uint64_t> notify, Callback done, Millis timeout) {
  Op* op = issue(OpKind::kWrite, std::move(done), timeout);
  Status st = check_key(dst, dst_offset, len, "write");
  if (st.is_ok() && src == nullptr && len > 0) {
    st = RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_, "null source buffer");
  }
  if (!st.is_ok()) {
    op->preset = std::move(st);
    return core_->submit(op);
  }
  op->src = src;
  op->len = len;
  op->offset = dst_offset;
  op->has_notify = notify.has_value();
  op->notify = notify.value_or(0);
  op->key_id = dst.key_id;
  op->key_secret = dst.secret;
  op->key_addr = dst.addr;
  op->key_length = dst.length;
  op->put_path = (put_path_ && len > 0 && len > core_->options().eager_max) || (direct_ && len > 0);
  if (op->put_path) {
    std::lock_guard<std::mutex> lock(known_mu_);
    if (!known_keys_.count(dst.key_id)) op->blob = dst.blob;
  }
  core_->submit(op);
}

void UcxChannel::read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset,
                      Callback done, Millis timeout) {
  Op* op = issue(OpKind::kRead, std::move(done), timeout);
  Status st = check_key(src, src_offset, len, "read");
  if (st.is_ok() && dst == nullptr && len > 0) {
    st = RDMAFLOW_ERROR(Code::kInvalidArgument, "read", peer_, "null destination buffer");
  }
  if (!st.is_ok()) {
    op->preset = std::move(st);
    return core_->submit(op);
  }
  op->dst = dst;
  op->len = len;
  op->offset = src_offset;
  op->key_id = src.key_id;
  op->key_secret = src.secret;
  op->key_addr = src.addr;
  op->key_length = src.length;
  op->put_path = (put_path_ || direct_) && len > 0;
  if (op->put_path) {
    std::lock_guard<std::mutex> lock(known_mu_);
    if (!known_keys_.count(src.key_id)) op->blob = src.blob;
  }
  core_->submit(op);
}

void UcxChannel::send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) {
  Op* op = issue(OpKind::kMessage, std::move(done), timeout);
  op->bytes = std::move(bytes);
  core_->submit(op);
}

Result<DirectView> UcxChannel::direct_view(const RemoteKey& key, uint64_t offset, size_t len,
                                           Millis timeout) {
  const char* op = "direct view";
  RDMAFLOW_RETURN_IF_ERROR(check_key(key, offset, len, op));
  if (len == 0) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_, "empty range");
  if (state() != State::kOpen) {
    Status st = error();
    if (!st.is_ok()) return st.with_op(op);
  }
  {
    std::lock_guard<std::mutex> lock(core_->worker_mu_);
    if (!direct_) {
      return RDMAFLOW_ERROR(Code::kNotViable, op, peer_,
                            "the peer is not reached through shared memory");
    }
  }
  // Resolve the key with its owner (once per key and channel), which maps the
  // region when it is shared: a one-byte read takes that path.
  uint8_t probe = 0;
  Completion resolved;
  read(&probe, 1, key, offset, resolved.callback(), timeout);
  RDMAFLOW_RETURN_IF_ERROR(resolved.wait(timeout + Millis(1000), "resolve key for direct view"));
  std::lock_guard<std::mutex> lock(core_->worker_mu_);
  if (failed_) return error().with_op(op);
  auto it = keys_.find(key.key_id);
  if (it == keys_.end() || it->second.state != KeyEntry::State::kValid ||
      it->second.secret != key.secret) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, peer_,
                          "key id " + std::to_string(key.key_id) + " is not confirmed");
  }
  const KeyEntry& e = it->second;
  // Bounds against the grant the owner confirmed, then against the shared pages.
  const uint64_t start = key.addr + offset;
  if (start < e.addr || start - e.addr > e.length || len > e.length - (start - e.addr)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer_,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(e.length) +
                              " bytes the peer granted by key id " + std::to_string(key.key_id));
  }
  auto m = e.region == 0 ? maps_.end() : maps_.find(e.region);
  if (m == maps_.end() || start < m->second.remote_base ||
      start - m->second.remote_base > m->second.length ||
      len > m->second.length - (start - m->second.remote_base)) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, peer_,
                          "the range is not in memory the peer shares");
  }
  DirectView view;
  view.data = reinterpret_cast<std::byte*>(m->second.ptr + (start - m->second.remote_base));
  view.length = len;
  view.keep = m->second.mem;
  return view;
}

void UcxChannel::close() {
  {
    std::lock_guard<std::mutex> lock(core_->worker_mu_);
    if (core_->stopped()) return;
    close_locked(RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_, "channel closed"));
    core_->pass_locked();
  }
  core_->kick();
}

// ---------------------------------------------------------------------------
// Progress context: sending

void UcxChannel::attach(ucp_ep_h ep, bool put_path, int pidfd) {
  ep_ = ep;
  put_path_ = put_path;
  pidfd_ = pidfd;
  direct_ = !put_path && pidfd >= 0 && core_->options().direct;
}

void UcxChannel::opened() {
  state_.store(State::kOpen, std::memory_order_release);
  core_->notify_control();
}

void UcxChannel::enqueue(Op* op) {
  if (failed_) {
    core_->complete(op, error().with_op(op->name()));
    return;
  }
  core_->add_ref(op);  // the queue's
  op->qnext = nullptr;
  (q_tail_ ? q_tail_->qnext : q_head_) = op;
  q_tail_ = op;
  core_->mark_dirty(this);
}

void UcxChannel::pump() {
  while (q_head_ != nullptr && !failed_) {
    Op* op = q_head_;
    const Step step = post(op);
    if (failed_) return;  // fail() emptied the queue, this op included
    if (step == Step::kStall) return;
    q_head_ = op->qnext;
    if (q_head_ == nullptr) q_tail_ = nullptr;
    op->qnext = nullptr;
    core_->release(op);
  }
}

UcxChannel::Step UcxChannel::post(Op* op) {
  if (op->user_done && op->kind != OpKind::kRevokeAck) return Step::kPosted;  // timed out
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
    if (failed_) return false;
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
  if (failed_) return;
  if (status != UCS_OK) return fail(st);
  if (!flush_waiters_.empty() || !retired_rkeys_.empty()) issue_flush();
  core_->mark_dirty(this);
}

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
  if (failed_ || ep_ == nullptr) return;
  Op* op = core_->ctrl_op(this);
  op->hdr = h;
  op->bytes = std::move(data);
  core_->add_ref(op);
  post_am(op, op->bytes.data(), op->bytes.size(), 0);
  core_->release(op);
}

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
      uint8_t* target = direct_ptr(*k, op);
      if (target == nullptr) {  // not in the peer's shared pages: the receiver places it
        op->put_path = false;
        return post_write(op);
      }
      // An earlier write still travelling as an AM must not land after this copy.
      if (am_writes_inflight_ > 0) return Step::kStall;
      if (!copy_direct(target, op->src, op->len)) return Step::kPosted;  // fail() completed op
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
    const uint8_t* source = direct_ptr(*k, op);
    if (source == nullptr) {  // not in the peer's shared pages: the owner answers a request
      op->put_path = false;
      return post_read(op);
    }
    if (!copy_direct(op->dst, source, op->len)) return Step::kPosted;  // fail() completed op
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
// Progress context: receiving

ucs_status_t UcxChannel::on_am(const AmHeader& h, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const auto type = static_cast<MsgType>(h.type);
  switch (type) {
    case MsgType::kMessage:
    case MsgType::kWrite:
    case MsgType::kNotify:
    case MsgType::kBye:
      return on_ordered(h, data, length, param);
    case MsgType::kReadResp:
      return on_read_resp(h, data, length, param);
    default:
      break;
  }
  if (rndv) {
    protocol_error("unexpected rendezvous data for message type " + std::to_string(h.type));
    return UCS_OK;
  }
  switch (type) {
    case MsgType::kHelloAck:
      if (state() == State::kConnecting) {
        remote_id_ = static_cast<uint32_t>(h.id);
        opened();
      }
      break;
    case MsgType::kAck:
      on_ack(h, data, length);
      break;
    case MsgType::kReadReq:
      return on_read_req(h);
    case MsgType::kKeyQuery: {
      uint64_t addr = 0, len = 0, sum = 0;
      DirectInfo direct;
      Status st = core_->query_grant(h.key_id, h.secret, id_, peer_, &addr, &len, &sum, &direct);
      AmHeader reply;
      reply.type = static_cast<uint8_t>(MsgType::kKeyReply);
      reply.code = static_cast<uint16_t>(st.code());
      reply.channel = remote_id_;
      reply.id = h.id;
      reply.secret = sum;
      reply.value = addr;
      reply.length = len;
      std::vector<uint8_t> data;
      if (!st.is_ok()) {
        data.assign(st.reason().begin(), st.reason().end());
      } else if (pidfd_ >= 0 && direct.fd >= 0) {
        // A same-host peer may map the region's memfd and copy itself, and publish its
        // notifies in our ring.
        if (rx_ring_ == nullptr && !rx_ring_tried_ && core_->options().notify_ring) {
          rx_ring_tried_ = true;
          auto ring = shm::NotifyRing::create(core_->options().ring_slots);
          if (ring.is_ok()) {
            rx_ring_ = std::move(ring).value();
            core_->ring_channels_.push_back(this);
          } else {
            RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: no notify ring: {}", id_, peer_,
                               ring.status().reason());
          }
        }
        if (rx_ring_ != nullptr) {
          direct.ring_fd = rx_ring_->fd();
          direct.ring_slots = rx_ring_->slots();
        }
        data.resize(sizeof(direct));
        std::memcpy(data.data(), &direct, sizeof(direct));
      }
      post_ctrl(reply, std::move(data));
      break;
    }
    case MsgType::kKeyReply:
      on_key_reply(h, data, length);
      break;
    case MsgType::kRevoke: {
      if (length % 8 != 0) {
        protocol_error("malformed revocation list");
        break;
      }
      std::vector<uint64_t> ids(length / 8);
      if (length > 0) std::memcpy(ids.data(), data, length);
      revoked(h.id, ids);
      break;
    }
    case MsgType::kRevokeAck:
      core_->on_revoke_ack(h.id, id_);
      break;
    case MsgType::kRingWake:
      break;  // this pass polls the ring
    default:
      protocol_error("unknown message type " + std::to_string(h.type));
      break;
  }
  return UCS_OK;
}

ucs_status_t UcxChannel::on_ordered(const AmHeader& h, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (h.seq < rx_next_ || rx_held_.count(h.seq)) {
    protocol_error("duplicate sequence number " + std::to_string(h.seq));
    return UCS_OK;
  }
  const bool held = h.seq != rx_next_;
  RxItem local;
  RxItem* item = (held || rndv) ? new RxItem() : &local;
  item->ch = this;
  item->type = static_cast<MsgType>(h.type);
  item->seq = h.seq;
  void* rndv_target = nullptr;
  switch (item->type) {
    case MsgType::kMessage:
      if (rndv) {
        item->bytes.resize(length);
        rndv_target = item->bytes.data();
      } else {
        item->bytes.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + length);
      }
      break;
    case MsgType::kWrite:
    case MsgType::kNotify: {
      item->has_notify = (h.flags & kFlagNotify) != 0;
      item->notify = h.value;
      if (item->type == MsgType::kWrite && length != h.length) {
        if (item != &local) delete item;
        protocol_error("write carries " + std::to_string(length) + " bytes, header says " +
                       std::to_string(h.length));
        return UCS_OK;
      }
      uint8_t* target = nullptr;
      Status st =
          core_->resolve_grant(h.key_id, h.secret, h.offset, h.length, "write", peer_, &target);
      if (!st.is_ok()) {
        item->code = static_cast<uint16_t>(st.code());
        item->reason = st.reason();
      } else if (item->type == MsgType::kWrite && length > 0) {
        RDMAFLOW_LOG_TRACE("ucx: rank {} writes {} bytes at offset {} of key id {}", peer_, length,
                           h.offset, h.key_id);
        if (rndv) {
          rndv_target = target;
        } else {
          std::memcpy(target, data, length);
        }
      }
      break;
    }
    case MsgType::kBye:
      break;
    default:
      break;
  }
  if (rndv_target != nullptr) {
    // Rendezvous: UCP pulls the payload straight into place (CMA on shared memory).
    item->ready = false;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxChannel::on_rx_data;
    p.user_data = item;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(core_->worker(), data, rndv_target, length, &p);
    if (r == nullptr) {
      item->ready = true;
    } else if (UCS_PTR_IS_ERR(r)) {
      item->ready = true;
      item->code = static_cast<uint16_t>(Code::kInternal);
      item->reason =
          std::string("receiving the payload failed: ") + ucs_status_string(UCS_PTR_STATUS(r));
    } else {
      note_request();
    }
  }
  if (!held && item->ready) {
    deliver(*item);
    ++rx_next_;
    if (item != &local) delete item;
    deliver_ready();
  } else {
    rx_held_.emplace(h.seq, item);
  }
  return UCS_OK;
}

void UcxChannel::on_rx_data(void* request, ucs_status_t status, size_t /*length*/, void* user) {
  if (request != nullptr) ucp_request_free(request);
  auto* item = static_cast<RxItem*>(user);
  --item->ch->requests_inflight_;
  if (item->orphan) {
    delete item;
    return;
  }
  UcxChannel* ch = item->ch;
  item->ready = true;
  if (status != UCS_OK && item->code == 0) {
    if (item->type == MsgType::kMessage) {
      ch->protocol_error(std::string("receiving a message failed: ") + ucs_status_string(status));
      return;
    }
    item->code = static_cast<uint16_t>(Code::kPeerFailed);
    item->reason = std::string("receiving the payload failed: ") + ucs_status_string(status);
  }
  ch->deliver_ready();
}

void UcxChannel::deliver(RxItem& item) {
  switch (item.type) {
    case MsgType::kMessage:
      core_->emit_message(inbox_, std::move(item.bytes));
      break;
    case MsgType::kWrite:
    case MsgType::kNotify:
      if (item.code != 0) {
        append_refusal(ack_refusals_, Refusal{item.seq, item.code, item.reason});
      } else if (item.has_notify) {
        core_->emit_notify(inbox_, item.notify);  // every byte is in place by now
      }
      ack_needed_ = true;
      core_->mark_dirty(this);
      break;
    case MsgType::kBye:
      fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", peer_,
                          "peer rank " + std::to_string(peer_) + " closed the channel"));
      break;
    default:
      break;
  }
}

void UcxChannel::deliver_ready() {
  while (!failed_ && !rx_held_.empty()) {
    auto it = rx_held_.begin();
    if (it->first != rx_next_ || !it->second->ready) break;
    RxItem* item = it->second;
    rx_held_.erase(it);
    deliver(*item);
    ++rx_next_;
    delete item;
  }
}

void UcxChannel::flush_acks() {
  if (!ack_needed_ || failed_) return;
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

void UcxChannel::on_ack(const AmHeader& h, const void* data, size_t length) {
  std::vector<Refusal> refusals;
  if (!parse_refusals({static_cast<const uint8_t*>(data), length}, refusals)) {
    protocol_error("malformed acknowledgement");
    return;
  }
  const uint64_t from = h.offset, upto = h.length;
  for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
    Op* op = *it;
    if (op->seq < from || op->seq >= upto) {
      ++it;
      continue;
    }
    it = awaiting_ack_.erase(it);
    if (direct_ && op->hdr.type == static_cast<uint8_t>(MsgType::kWrite) && op->len > 0 &&
        am_writes_inflight_ > 0 && --am_writes_inflight_ == 0) {
      core_->mark_dirty(this);  // direct copies held back behind it may go
    }
    Status st;
    for (const Refusal& r : refusals) {
      if (r.seq == op->seq) {
        st = Status(wire_code(r.code), "write", peer_, "peer refused the write: " + r.reason);
      }
    }
    core_->part_done(op, st);
    core_->release(op);
  }
}

void UcxChannel::on_key_reply(const AmHeader& h, const void* data, size_t length) {
  auto it = keys_.find(h.id);
  if (it == keys_.end() || it->second.state != KeyEntry::State::kQuerying) return;
  KeyEntry& e = it->second;
  const std::string key = "key id " + std::to_string(h.id);
  if (h.code != 0) {
    e.state = KeyEntry::State::kRefused;
    e.refusal = Status(wire_code(h.code), "write", peer_,
                       "peer refused " + key + ": " + text(data, length, false));
  } else if (h.secret != rkey_checksum(e.blob)) {
    // Never hand UCX an rkey the owner did not pack.
    e.state = KeyEntry::State::kRefused;
    e.refusal = RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_,
                               "the rkey carried by " + key + " is not the one the peer packed");
  } else if (direct_) {
    // No rkey needed: memcpy through the peer's shared region, or the am path.
    e.addr = h.value;
    e.length = h.length;
    e.state = KeyEntry::State::kValid;
    DirectInfo info;
    if (length == sizeof(info)) {
      std::memcpy(&info, data, sizeof(info));
      if (info.magic == DirectInfo::kMagic && info.region != 0 && info.length > 0 &&
          info.base + info.length > info.base && map_region(info)) {
        e.region = info.region;
      }
      if (info.magic == DirectInfo::kMagic && info.ring_fd >= 0 && tx_ring_ == nullptr &&
          !tx_ring_tried_ && core_->options().notify_ring) {
        tx_ring_tried_ = true;
        auto ring = shm::NotifyRing::map_peer(pidfd_, info.ring_fd, info.ring_slots);
        if (ring.is_ok()) {
          tx_ring_ = std::move(ring).value();
          tx_tail_ = tx_ring_->header()->tail.load(std::memory_order_acquire);
          RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: notifies go through its ring ({} slots)",
                             id_, peer_, info.ring_slots);
        } else {
          RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: notifies stay active messages: {}", id_,
                             peer_, ring.status().reason());
        }
      }
    }
    std::lock_guard<std::mutex> lock(known_mu_);
    known_keys_.insert(h.id);
  } else {
    e.addr = h.value;
    e.length = h.length;
    const ucs_status_t s = ucp_ep_rkey_unpack(ep_, e.blob.data(), &e.rkey);
    if (s != UCS_OK) {
      e.rkey = nullptr;
      e.state = KeyEntry::State::kRefused;
      e.refusal = RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_,
                                 "cannot unpack the rkey of " + key + ": " + ucs_status_string(s));
    } else {
      e.state = KeyEntry::State::kValid;
      std::lock_guard<std::mutex> lock(known_mu_);
      known_keys_.insert(h.id);  // issuers stop copying its blob
    }
  }
  core_->mark_dirty(this);
}

bool UcxChannel::map_region(const DirectInfo& info) {
  auto it = maps_.find(info.region);
  if (it == maps_.end()) {
    auto p = shm::map_peer_memfd(pidfd_, info.fd, info.length);
    if (!p.is_ok()) {
      RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: no direct access to region {}: {}", id_,
                         peer_, info.region, p.status().reason());
      return false;
    }
    const uint64_t len = info.length;
    std::shared_ptr<uint8_t> mem(*p, [len](uint8_t* q) { ::munmap(q, len); });
    it = maps_.emplace(info.region, Mapping{std::move(mem), *p, info.length, info.base, 0}).first;
    RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: region {} ({} bytes) mapped for direct access",
                       id_, peer_, info.region, info.length);
  }
  ++it->second.refs;
  return true;
}

void UcxChannel::unref_region(uint64_t region) {
  auto it = maps_.find(region);
  if (it == maps_.end() || --it->second.refs > 0) return;
  maps_.erase(it);
}

bool UcxChannel::copy_direct(void* dst, const void* src, size_t len) {
  // 4 MiB is about half a millisecond of copying: one poll() per slice costs under
  // 0.1%, and a peer that dies mid-transfer is noticed within a slice instead of
  // after the whole queue went into memory nobody will read.
  constexpr size_t kLivenessBytes = size_t{4} << 20;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  while (len > 0) {
    if (copied_since_check_ >= kLivenessBytes) {
      copied_since_check_ = 0;
      pollfd p{pidfd_, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0) {
        peer_exited();
        return false;
      }
    }
    const size_t n = std::min(len, kLivenessBytes - copied_since_check_);
    std::memcpy(d, s, n);
    d += n;
    s += n;
    len -= n;
    copied_since_check_ += n;
  }
  return true;
}

void UcxChannel::peer_exited() {
  peer_gone = true;
  if (failed_) return;
  fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", peer_,
                      "peer process " + std::to_string(peer_identity_.pid) + " exited"));
}

uint8_t* UcxChannel::direct_ptr(const KeyEntry& e, const Op* op) const {
  if (e.region == 0) return nullptr;
  // resolve_key checked [key_addr + offset, + len) against the grant; the peer shared
  // the whole pages of the grant's region, which may leave out its ragged ends.
  const Mapping& m = maps_.at(e.region);
  const uint64_t start = op->key_addr + op->offset;
  if (start < m.remote_base || start - m.remote_base > m.length ||
      op->len > m.length - (start - m.remote_base)) {
    return nullptr;
  }
  return m.ptr + (start - m.remote_base);
}

ucs_status_t UcxChannel::on_read_req(const AmHeader& h) {
  uint8_t* src = nullptr;
  Status st = core_->resolve_grant(h.key_id, h.secret, h.offset, h.length, "read", peer_, &src);
  Op* op = core_->ctrl_op(this);
  op->hdr.type = static_cast<uint8_t>(MsgType::kReadResp);
  op->hdr.channel = remote_id_;
  op->hdr.id = h.id;
  op->hdr.length = h.length;
  core_->add_ref(op);
  if (st.is_ok()) {
    post_am(op, src, h.length, 0);  // rendezvous for large reads: the reader pulls
  } else {
    op->hdr.code = static_cast<uint16_t>(st.code());
    op->bytes.assign(st.reason().begin(), st.reason().end());
    post_am(op, op->bytes.data(), op->bytes.size(), 0);
  }
  core_->release(op);
  return UCS_OK;
}

ucs_status_t UcxChannel::on_read_resp(const AmHeader& h, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  auto it = reads_.find(h.id);
  if (it == reads_.end()) return UCS_OK;  // unknown or already failed: drop
  Op* op = it->second;
  reads_.erase(it);
  if (op->user_done) {  // timed out: never touch the caller's buffer any more
    core_->release(op);
    return UCS_OK;
  }
  if (h.code != 0) {
    core_->part_done(op, Status(wire_code(h.code), "read", peer_,
                                "peer refused the read: " + text(data, length, rndv)));
  } else if (length != op->len) {
    core_->part_done(op, RDMAFLOW_ERROR(Code::kProtocolError, "read", peer_,
                                        "response carries " + std::to_string(length) + " bytes, " +
                                            std::to_string(op->len) + " requested"));
  } else if (rndv) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxChannel::on_read_data;
    p.user_data = op;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(core_->worker(), data, op->dst, length, &p);
    if (r == nullptr) {
      core_->part_done(op, Status::ok());
    } else if (UCS_PTR_IS_ERR(r)) {
      core_->part_done(op, ucs_error("read", UCS_PTR_STATUS(r)));
    } else {
      note_request();
      return UCS_OK;  // the reads_ reference moves to the receive request
    }
  } else {
    if (length > 0) std::memcpy(op->dst, data, length);
    core_->part_done(op, Status::ok());
  }
  core_->release(op);
  return UCS_OK;
}

void UcxChannel::on_read_data(void* request, ucs_status_t status, size_t /*length*/, void* user) {
  if (request != nullptr) ucp_request_free(request);
  auto* op = static_cast<Op*>(user);
  UcxChannel* ch = op->ch;
  --ch->requests_inflight_;
  ch->core_->part_done(op, status == UCS_OK ? Status::ok() : ch->ucs_error("read", status));
  ch->core_->release(op);
}

// ---------------------------------------------------------------------------
// Notify ring (transport/shm/notify_ring.h, docs/ucx.md "Notify ring")

namespace {
// A ring entry may run ahead of the receiver's sequence by the ordered AMs still
// on their way; anything further is not a sequence number this peer could have sent.
constexpr uint64_t kMaxSeqAhead = uint64_t{1} << 32;
}  // namespace

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
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) send_ctrl(MsgType::kRingWake, 0, {});
  return true;
}

void UcxChannel::ring_error(const std::string& what) {
  fail(RDMAFLOW_ERROR(
      Code::kProtocolError, "notify ring", peer_,
      "peer rank " + std::to_string(peer_) + " published a bad entry in the notify ring: " + what));
}

bool UcxChannel::poll_ring() {
  if (rx_ring_ == nullptr || failed_) return false;
  // Everything read from the ring is the peer's word: indices come from our own head,
  // the tail is bounds-checked, every entry is checked against the grant table.
  const uint64_t tail = rx_ring_->header()->tail.load(std::memory_order_acquire);
  if (tail == rx_head_) return false;
  const std::shared_ptr<shm::NotifyRing> ring = rx_ring_;  // fail() may drop ours meanwhile
  shm::RingHeader* h = ring->header();
  if (tail - rx_head_ > ring->slots()) {
    ring_error("tail " + std::to_string(tail) + " is not within the " +
               std::to_string(ring->slots()) + " slots after head " + std::to_string(rx_head_));
    return true;
  }
  const uint64_t start = rx_head_;
  while (rx_head_ != tail && !failed_) {
    shm::RingSlot s;
    std::memcpy(&s, ring->slot(rx_head_), sizeof(s));  // checked as copied
    if (s.seq != rx_next_) {
      if (s.seq < rx_next_ || s.seq - rx_next_ > kMaxSeqAhead || rx_held_.count(s.seq)) {
        ring_error("sequence number " + std::to_string(s.seq) + " (expected " +
                   std::to_string(rx_next_) + ")");
        return true;
      }
      break;  // an ordered AM before it is still on its way; it resumes the ring
    }
    auto g = core_->grants_.find(s.key_id);
    if (g == core_->grants_.end()) {
      if (s.key_id == 0 || s.key_id >= core_->next_key_) {
        ring_error("key id " + std::to_string(s.key_id) + " was never exported here");
        return true;
      }
      // Revoked after the writer checked it: dropped, as a kNotify would be refused.
      RDMAFLOW_LOG_DEBUG("ucx: rank {}: notify {} for revoked key id {} dropped", peer_, s.notify,
                         s.key_id);
    } else if (g->second.secret != s.secret) {
      ring_error("wrong secret for key id " + std::to_string(s.key_id));
      return true;
    } else if (!(s.offset <= g->second.len && s.length <= g->second.len - s.offset)) {
      ring_error("offset " + std::to_string(s.offset) + " + length " + std::to_string(s.length) +
                 " exceeds the " + std::to_string(g->second.len) + " bytes granted by key id " +
                 std::to_string(s.key_id));
      return true;
    } else {
      core_->emit_notify(inbox_, s.notify);  // the tail's acquire: the bytes are in place
    }
    ++rx_head_;
    ++rx_next_;
    deliver_ready();  // ordered AMs that waited for this entry
  }
  if (rx_head_ == start) return false;
  h->head.store(rx_head_, std::memory_order_release);
  return true;
}

bool UcxChannel::ring_deliverable() const {
  if (rx_ring_ == nullptr || failed_) return false;
  const uint64_t tail = rx_ring_->header()->tail.load(std::memory_order_seq_cst);
  if (tail == rx_head_) return false;
  if (tail - rx_head_ > rx_ring_->slots()) return true;  // poll_ring reports it
  shm::RingSlot s;
  std::memcpy(&s, rx_ring_->slot(rx_head_), sizeof(s));
  // An entry waiting for an earlier ordered AM is not: that AM wakes us when it comes.
  return !(s.seq > rx_next_ && s.seq - rx_next_ <= kMaxSeqAhead && !rx_held_.count(s.seq));
}

std::shared_ptr<shm::NotifyRing> notify_ring_for_testing(Channel& channel) {
  auto* ch = dynamic_cast<UcxChannel*>(&channel);
  if (ch == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(ch->core_->worker_mu_);
  return ch->tx_ring();
}

// ---------------------------------------------------------------------------
// Failure

Status UcxChannel::ucs_error(const char* op, ucs_status_t status) const {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.is_ok()) return error_.with_op(op);
  }
  return RDMAFLOW_ERROR(Code::kPeerFailed, op, peer_,
                        std::string("UCX reports ") + ucs_status_string(status));
}

void UcxChannel::protocol_error(const std::string& what) {
  fail(RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_, what));
}

void UcxChannel::close_locked(const Status& st) {
  if (failed_) return;
  Op* bye = nullptr;
  if (ep_ != nullptr && state() == State::kOpen) {
    // Goodbye, ordered after everything already sent. The endpoint is closed (FORCE)
    // as soon as it has left, so the peer's channel fails naming us.
    bye = core_->ctrl_op(this);
    bye->hdr.type = static_cast<uint8_t>(MsgType::kBye);
    bye->hdr.channel = remote_id_;
    bye->hdr.seq = tx_seq_++;
    core_->add_ref(bye);  // ours, until the endpoint is closed
    post_am(bye, nullptr, 0, 0);
    if (bye->refs == 1) {  // sent already (or failed): nothing to wait for
      core_->release(bye);
      bye = nullptr;
    }
  }
  fail(st, bye);
}

void UcxChannel::fail(const Status& st, Op* linger_on) {
  if (failed_) return;
  failed_ = true;
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    error_ = st;
  }
  state_.store(State::kFailed, std::memory_order_release);
  RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {} failed: {}", id_, peer_, st.to_string());
  for (Op* op = q_head_; op != nullptr;) {
    Op* next = op->qnext;
    op->qnext = nullptr;
    core_->complete(op, st.with_op(op->name()));
    core_->release(op);
    op = next;
  }
  q_head_ = q_tail_ = nullptr;
  for (Op* op : awaiting_ack_) {
    core_->complete(op, st.with_op(op->name()));
    core_->release(op);
  }
  awaiting_ack_.clear();
  for (auto& [id, op] : reads_) {
    core_->complete(op, st.with_op(op->name()));
    core_->release(op);
  }
  reads_.clear();
  for (Op* op : flush_waiters_) {
    core_->complete(op, st.with_op(op->name()));
    core_->release(op);
  }
  flush_waiters_.clear();
  // Everything else still pending on this channel (ops waiting only for a UCP
  // request, which a forced close does not always complete).
  core_->complete_channel_ops(this, st);
  for (auto& [seq, item] : rx_held_) {
    if (item->ready) {
      delete item;
    } else {
      item->orphan = true;  // its receive completes (cancelled) once the endpoint closes
    }
  }
  rx_held_.clear();
  core_->emit_inbox_failure(inbox_, st);
  std::vector<ucp_rkey_h> rkeys = std::move(retired_rkeys_);
  retired_rkeys_.clear();
  for (auto& [id, e] : keys_) {
    if (e.rkey != nullptr) rkeys.push_back(e.rkey);
  }
  keys_.clear();
  maps_.clear();     // views handed out keep their mapping
  rx_ring_.reset();  // the core drops the channel from its ring list; sleepers keep theirs
  tx_ring_.reset();
  if (ep_ != nullptr) {
    core_->retire_ep(ep_, std::move(rkeys), linger_on);
    ep_ = nullptr;
  } else {
    for (ucp_rkey_h k : rkeys) ucp_rkey_destroy(k);
    if (linger_on != nullptr) core_->release(linger_on);
  }
  if (pidfd_ >= 0) {
    core_->unwatch_pidfd(pidfd_);
    ::close(pidfd_);
    pidfd_ = -1;
  }
  core_->channel_failed(id_);
}

}  // namespace rdmaflow::ucx
