// UcxChannel, receiving side (progress context): incoming active messages applied
// in sequence order, acknowledgements, key replies and the peer regions they let
// us map, read requests answered and read responses received, and the entries
// the peer publishes in our notify ring.
#include "transport/ucx/ucx_channel.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/tsan.h"
#include "transport/shm/shared_pages.h"

namespace rdmaflow::ucx {

namespace {

Code wire_code(uint16_t code) {
  if (code == 0 || code > static_cast<uint16_t>(Code::kInternal)) return Code::kInternal;
  return static_cast<Code>(code);
}

std::string text(const void* data, size_t length, bool rndv) {
  if (rndv || data == nullptr) return "";
  return std::string(static_cast<const char*>(data), std::min(length, kMaxReason));
}

}  // namespace

// ---------------------------------------------------------------------------
// Active messages

ucs_status_t UcxChannel::on_am(const AmHeader& h, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (std::string why = check_am(h, length, rndv, core_->options().max_message); !why.empty()) {
    protocol_error(why);
    return UCS_OK;
  }
  const auto type = static_cast<MsgType>(h.type);
  if (auth_acceptor_ != nullptr) {
    // Nothing but the proof passes before the proof: no byte of an unauthenticated
    // peer's message is looked at, let alone placed.
    if (type != MsgType::kAuthProof || rndv || length != auth::kProofBytes) {
      refuse("sent a message (type " + std::to_string(h.type) + ") before proving the job secret");
      return UCS_OK;
    }
    Status st = auth_acceptor_->verify(
        std::span<const uint8_t>(static_cast<const uint8_t*>(data), length), auth_peer_);
    if (!st.is_ok()) {
      refuse(st.reason());
      return UCS_OK;
    }
    auth_acceptor_.reset();
    opened();
    core_->authenticated_locked(this);
    return UCS_OK;
  }
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
  switch (type) {
    case MsgType::kHelloAck:
      if (state() == State::kConnecting && auth_connector_ != nullptr) {
        auto proof = auth_connector_->answer(
            std::span<const uint8_t>(static_cast<const uint8_t*>(data), length),
            "the UCX worker of rank " + std::to_string(peer_));
        auth_connector_.reset();
        if (!proof.is_ok()) {
          fail(Status(Code::kUnauthenticated, "connect", peer_, proof.status().reason()));
          break;
        }
        remote_id_ = static_cast<uint32_t>(h.id);
        send_ctrl(MsgType::kAuthProof, id_, std::vector<uint8_t>(proof->begin(), proof->end()));
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
      if (st.code() == Code::kUnauthenticated) return forged_key(st);
      AmHeader reply;
      reply.type = static_cast<uint8_t>(MsgType::kKeyReply);
      reply.code = static_cast<uint16_t>(st.code());
      reply.channel = remote_id_;
      reply.id = h.id;
      reply.secret.lo = sum;
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
          direct.wake_fd = core_->ring_wake_fd_;
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
    case MsgType::kRevoke:
      revoked(h.id, parse_revocations({static_cast<const uint8_t*>(data), length}));
      break;
    case MsgType::kRevokeAck:
      core_->on_revoke_ack(h.id, id_);
      break;
    case MsgType::kRingWake:
      break;  // this pass polls the ring (from a writer without our eventfd)
    default:
      break;  // kHello: only a listener's (ucx_core.cc); check_am() refused unknown types
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
  if (held && rx_held_.size() >= core_->options().max_peer_queued) {
    // Out-of-order messages wait for the ones before them; a peer that never sends
    // those would make the wait list grow without bound.
    protocol_error(
        "sequence number " + std::to_string(h.seq) + " while " + std::to_string(rx_held_.size()) +
        " messages wait for number " + std::to_string(rx_next_) +
        " (RDMAFLOW_MAX_PEER_QUEUED=" + std::to_string(core_->options().max_peer_queued) + ")");
    return UCS_OK;
  }
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
      uint8_t* target = nullptr;
      Status st =
          core_->grants().resolve(h.key_id, h.secret, h.offset, h.length, &target, "write", peer_);
      if (st.code() == Code::kUnauthenticated) {
        if (item != &local) delete item;
        return forged_key(st);
      } else if (!st.is_ok()) {
        item->code = static_cast<uint16_t>(st.code());
        item->reason = st.reason();
      } else if (item->type == MsgType::kWrite && length > 0) {
        RDMAFLOW_LOG_TRACE("ucx: rank {} writes {} bytes at offset {} of key id {}", peer_, length,
                           h.offset, h.key_id);
        if (rndv) {
          rndv_target = target;
        } else {
          PeerAccess::begin();  // the peer's bytes, ordered by the peer (common/tsan.h)
          std::memcpy(target, data, length);
          PeerAccess::end();
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
        if (core_->options().hold_acks) core_->hold_ack(this);
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
  while (!failed() && !rx_held_.empty()) {
    auto it = rx_held_.begin();
    if (it->first != rx_next_ || !it->second->ready) break;
    RxItem* item = it->second;
    rx_held_.erase(it);
    deliver(*item);
    ++rx_next_;
    delete item;
  }
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

// ---------------------------------------------------------------------------
// Key replies and the peer regions they map

void UcxChannel::on_key_reply(const AmHeader& h, const void* data, size_t length) {
  auto it = keys_.find(h.id);
  if (it == keys_.end() || it->second.state != KeyEntry::State::kQuerying) return;
  KeyEntry& e = it->second;
  const std::string key = "key id " + std::to_string(h.id);
  if (h.code != 0) {
    e.state = KeyEntry::State::kRefused;
    e.refusal = Status(wire_code(h.code), "write", peer_,
                       "peer refused " + key + ": " + text(data, length, false));
  } else if (h.secret.lo != rkey_checksum(e.blob)) {
    // Never hand UCX an rkey the owner did not pack.
    e.state = KeyEntry::State::kRefused;
    e.refusal = RDMAFLOW_ERROR(Code::kInvalidArgument, "write", peer_,
                               "the rkey carried by " + key + " is not the one the peer packed");
  } else if (direct_) {
    // No rkey needed: memcpy through the peer's shared region, or the am path.
    e.addr = h.value;
    e.length = h.length;
    e.state = KeyEntry::State::kValid;
    if (auto direct = parse_direct_info({static_cast<const uint8_t*>(data), length})) {
      const DirectInfo& info = *direct;
      if (region_usable(info) && map_region(info)) e.region = info.region;
      if (info.ring_fd >= 0 && tx_ring_ == nullptr && !tx_ring_tried_ &&
          core_->options().notify_ring) {
        tx_ring_tried_ = true;
        auto ring = shm::NotifyRing::map_peer(pidfd_, info.ring_fd, info.ring_slots, info.wake_fd);
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
    std::shared_ptr<void> keep(*p, [len](void* q) { ::munmap(q, len); });
    shm::PeerMemory memory(reinterpret_cast<std::byte*>(*p), len, std::move(keep), peer_);
    it = maps_.emplace(info.region, Mapping{std::move(memory), info.base, 0}).first;
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

// ---------------------------------------------------------------------------
// Reads: requests answered, responses received

ucs_status_t UcxChannel::on_read_req(const AmHeader& h) {
  uint8_t* src = nullptr;
  Status st = core_->grants().resolve(h.key_id, h.secret, h.offset, h.length, &src, "read", peer_);
  if (st.code() == Code::kUnauthenticated) return forged_key(st);
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
  if (op->completed) {  // timed out: never touch the caller's buffer any more
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

void UcxChannel::expect_proof(std::unique_ptr<auth::Acceptor> acceptor, std::string who) {
  auth_acceptor_ = std::move(acceptor);
  auth_peer_ = std::move(who);
  auth_since_ = Clock::now();
}

void UcxChannel::refuse(const std::string& why) {
  RDMAFLOW_LOG_WARN("ucx: refused {}: {}", auth_peer_, why);
  auth_acceptor_.reset();
  fail(RDMAFLOW_ERROR(Code::kUnauthenticated, "accept", peer_, auth_peer_ + ": " + why));
}

ucs_status_t UcxChannel::forged_key(const Status& why) {
  // Nothing of the message reaches memory; with a goodbye, so the forger's side
  // fails too rather than wait for an answer.
  close_locked(forged_secret_failure("ucx", why, peer_));
  return UCS_OK;
}

void UcxChannel::ring_error(const std::string& what) {
  fail(RDMAFLOW_ERROR(
      Code::kProtocolError, "notify ring", peer_,
      "peer rank " + std::to_string(peer_) + " published a bad entry in the notify ring: " + what));
}

bool UcxChannel::poll_ring() {
  if (rx_ring_ == nullptr || failed()) return false;
  // Everything read from the ring is the peer's word: indices come from our own head,
  // the tail is bounds-checked, every entry is checked against the grant table.
  const uint64_t tail = rx_ring_->header()->tail.load(std::memory_order_acquire);
  if (tail == rx_head_) return false;
  const std::shared_ptr<shm::NotifyRing> ring = rx_ring_;  // fail() may drop ours meanwhile
  shm::RingHeader* h = ring->header();
  if (!shm::ring_published(tail, rx_head_, ring->slots())) {
    ring_error("tail " + std::to_string(tail) + " is not within the " +
               std::to_string(ring->slots()) + " slots after head " + std::to_string(rx_head_));
    return true;
  }
  const uint64_t start = rx_head_;
  // One hold of the grant table for the whole batch (lock order: ucx_core.h). Nothing
  // below changes the table; what runs from here (deliveries, fail()) only queues.
  const GrantTable::Reader grants(core_->grants());
  while (rx_head_ != tail && !failed()) {
    shm::RingSlot s;
    std::memcpy(&s, ring->slot(rx_head_), sizeof(s));  // checked as copied
    const shm::EntryOrder order = shm::entry_order(s.seq, rx_next_, rx_held_.count(s.seq) > 0);
    if (order != shm::EntryOrder::kNext) {
      if (order == shm::EntryOrder::kBad) {
        ring_error("sequence number " + std::to_string(s.seq) + " (expected " +
                   std::to_string(rx_next_) + ")");
        return true;
      }
      break;  // an ordered AM before it is still on its way; it resumes the ring
    }
    uint8_t* target = nullptr;
    Status st =
        grants.resolve(s.key_id, s.secret, s.offset, s.length, &target, "notify ring", peer_);
    if (st.is_ok()) {
      core_->emit_notify(inbox_, s.notify);  // the tail's acquire: the bytes are in place
    } else if (grants.state(s.key_id) == GrantTable::KeyState::kRevoked) {
      // Revoked after the writer checked it: dropped, as a kNotify would be refused.
      RDMAFLOW_LOG_DEBUG("ucx: rank {}: notify {} for revoked key id {} dropped", peer_, s.notify,
                         s.key_id);
    } else if (grants.state(s.key_id) == GrantTable::KeyState::kNeverIssued) {
      ring_error("key id " + std::to_string(s.key_id) + " was never exported here");
      return true;
    } else {
      ring_error(st.reason());  // wrong secret, or a range outside the grant
      return true;
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
  if (rx_ring_ == nullptr || failed()) return false;
  const uint64_t tail = rx_ring_->header()->tail.load(std::memory_order_seq_cst);
  if (tail == rx_head_) return false;
  if (!shm::ring_published(tail, rx_head_, rx_ring_->slots())) return true;  // poll_ring reports it
  shm::RingSlot s;
  std::memcpy(&s, rx_ring_->slot(rx_head_), sizeof(s));
  // An entry waiting for an earlier ordered AM is not: that AM wakes us when it comes.
  return shm::entry_order(s.seq, rx_next_, rx_held_.count(s.seq) > 0) != shm::EntryOrder::kLater;
}

}  // namespace rdmaflow::ucx
