// UcxChannel (ucx_channel.h): construction, the API issuing threads call, and
// failure and close. The protocol's two sides are ucx_send.cc and ucx_recv.cc.
#include "transport/ucx/ucx_channel.h"

#include <unistd.h>

#include <string>

#include "common/log.h"
#include "transport/channel_trace.h"

namespace rdmaflow::ucx {

UcxChannel::UcxChannel(std::shared_ptr<UcxCore> core, uint32_t id, int peer_rank,
                       const ProcessIdentity& peer)
    : core_(std::move(core)), id_(id), peer_(peer_rank), peer_identity_(peer) {
  inbox_.set_peer(peer_rank);
  bind_counters("ucx", peer_rank);
  const Options& o = core_->options();
  if (o.busy_poll || o.wait_spin.count() > 0 || o.wait_block) inbox_.set_wait_driver(core_);
}

UcxChannel::~UcxChannel() {
  if (pidfd_ >= 0) ::close(pidfd_);
  for (auto& [seq, item] : rx_held_) delete item;
}

Status UcxChannel::error() const {
  return error_.get();
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
  // UCX rkeys grant the whole registered slab: the grant's bounds are enforced here.
  return check_key_use(key, "ucx", offset, len, op, peer_);
}

void UcxChannel::write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                       std::optional<uint64_t> notify, Callback done, Millis timeout) {
  trace_op(done, "write", *this, len);
  counters_->add_write(len);
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
  trace_op(done, "read", *this, len);
  counters_->add_read(len);
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
  trace_op(done, "message", *this, bytes.size());
  counters_->add_message_sent(bytes.size());
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
  if (failed()) return error_.for_op(op);
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
      !m->second.memory.covers(start - m->second.remote_base, len)) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, peer_,
                          "the range is not in memory the peer shares");
  }
  const shm::PeerMemory& memory = m->second.memory;
  DirectView view;
  view.data = memory.data() + (start - m->second.remote_base);
  view.length = len;
  view.keep = memory.keep();
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
// Progress context: setup

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

// ---------------------------------------------------------------------------
// Failure

Status UcxChannel::ucs_error(const char* op, ucs_status_t status) const {
  if (failed()) return error_.for_op(op);
  return RDMAFLOW_ERROR(Code::kPeerFailed, op, peer_,
                        std::string("UCX reports ") + ucs_status_string(status));
}

void UcxChannel::protocol_error(const std::string& what) {
  fail(RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_, what));
}

void UcxChannel::close_locked(const Status& st) {
  if (failed()) return;
  Op* bye = nullptr;
  if (ep_ != nullptr && state() == State::kOpen) {
    // What we applied is acknowledged before the goodbye, even if it was held.
    ack_held = false;  // the core's list may still name us: its flush finds nothing
    flush_acks();
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
  if (!error_.set(st)) return;  // the first failure is the one reported
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

void UcxChannel::peer_exited() {
  peer_gone = true;
  if (failed()) return;
  fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", peer_,
                      "peer process " + std::to_string(peer_identity_.pid) + " exited"));
}

// ---------------------------------------------------------------------------
// Test hook

std::shared_ptr<shm::NotifyRing> notify_ring_for_testing(Channel& channel) {
  auto* ch = dynamic_cast<UcxChannel*>(&channel);
  if (ch == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(ch->core_->worker_mu_);
  return ch->tx_ring();
}

bool skip_sequence_numbers_for_testing(Channel& channel, uint64_t n) {
  auto* ch = dynamic_cast<UcxChannel*>(&channel);
  if (ch == nullptr) return false;
  std::lock_guard<std::mutex> lock(ch->core_->worker_mu_);
  ch->tx_seq_ += n;
  return true;
}

}  // namespace rdmaflow::ucx
