// VerbsChannel, sender side: issuing operations as work items, posting them as
// send-queue slots, credits and key verdicts allow, and their completions.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "common/env.h"
#include "common/log.h"
#include "transport/channel_trace.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_channel_internal.h"

namespace rdmaflow::verbs {

namespace {

std::string range_text(uint64_t offset, uint64_t len) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
         std::to_string(len) + ")";
}

}  // namespace

// ---------------------------------------------------------------- issuing

std::shared_ptr<VerbsChannel::Op> VerbsChannel::make_op(const char* name, Callback done,
                                                        Millis timeout, uint32_t parts) {
  auto op = std::make_shared<Op>();
  op->what = name;
  op->done = std::move(done);
  op->set_deadline(timeout.count() > 0 ? timeout : default_timeout());
  op->parts_total = parts;
  return op;
}

void VerbsChannel::reject(Callback done, Status status) {
  counters_->add_result(status);
  core_->defer_callback(std::move(done), std::move(status));
}

Result<uint32_t> VerbsChannel::check_key(const char* op, const RemoteKey& key, uint64_t offset,
                                         uint64_t len) const {
  int peer = peer_rank();
  if (key.backend != "verbs") {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, peer,
        "the remote key was exported by the '" + key.backend + "' backend, not verbs");
  }
  if (!key.covers(offset, len)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          range_text(offset, len) + " lies outside the key's " +
                              std::to_string(key.length) + " granted bytes");
  }
  if (key.blob.size() != 4) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer,
                          "malformed verbs key: blob of " + std::to_string(key.blob.size()) +
                              " bytes, expected a 4-byte rkey");
  }
  if (key.addr + offset < key.addr) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer, "remote address wraps around");
  }
  uint32_t rkey = 0;
  std::memcpy(&rkey, key.blob.data(), 4);
  return rkey;
}

void VerbsChannel::write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                         std::optional<uint64_t> notify, Callback done, Millis timeout) {
  trace_op(done, "write", *this, len);
  const char* name = "write";
  counters_->add_write(len);
  if (!error_.ok()) return reject(std::move(done), error_.for_op(name));
  auto rkey = check_key(name, dst, dst_offset, len);
  if (!rkey.is_ok()) return reject(std::move(done), rkey.status());
  std::optional<LocalMr> mr;
  if (len > 0) {
    mr = core_->find_mr(src, len);
    if (!mr) {
      return reject(std::move(done),
                    RDMAFLOW_ERROR(Code::kInvalidArgument, name, peer_rank(),
                                   "the source [" + std::to_string(addr_of(src)) + ", +" +
                                       std::to_string(len) +
                                       ") is not inside memory registered with the verbs "
                                       "transport (register it, e.g. through the arena)"));
    }
  }
  if (len == 0 && !notify) return reject(std::move(done), Status::ok());
  uint64_t chunk = core_->max_wr_bytes();
  uint32_t parts = len == 0 ? 1 : static_cast<uint32_t>((len + chunk - 1) / chunk);
  auto op = make_op(name, std::move(done), timeout, parts);
  KeyClaim claim{dst.key_id, dst.secret, dst.addr, dst.length, *rkey};
  std::vector<WorkItem> items;
  items.reserve(parts);
  for (uint32_t i = 0; i < parts; ++i) {
    WorkItem it;
    it.op = op;
    it.kind = Kind::kWrite;
    it.key = claim;
    uint64_t off = uint64_t{i} * chunk;
    it.length = static_cast<uint32_t>(std::min<uint64_t>(chunk, len - off));
    it.local = addr_of(src) + off;
    it.lkey = mr ? mr->lkey : 0;
    it.remote = dst.addr + dst_offset + off;
    it.rkey = *rkey;
    it.last = i + 1 == parts;
    if (it.last) it.notify = notify;  // RC order: earlier parts land first
    items.push_back(std::move(it));
  }
  submit(std::move(items), op);
}

void VerbsChannel::read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset,
                        Callback done, Millis timeout) {
  trace_op(done, "read", *this, len);
  const char* name = "read";
  counters_->add_read(len);
  if (!error_.ok()) return reject(std::move(done), error_.for_op(name));
  auto rkey = check_key(name, src, src_offset, len);
  if (!rkey.is_ok()) return reject(std::move(done), rkey.status());
  if (len == 0) return reject(std::move(done), Status::ok());
  auto mr = core_->find_mr(dst, len);
  if (!mr) {
    return reject(std::move(done),
                  RDMAFLOW_ERROR(Code::kInvalidArgument, name, peer_rank(),
                                 "the destination [" + std::to_string(addr_of(dst)) + ", +" +
                                     std::to_string(len) +
                                     ") is not inside memory registered with the verbs "
                                     "transport (register it, e.g. through the arena)"));
  }
  uint64_t chunk = core_->max_wr_bytes();
  uint32_t parts = static_cast<uint32_t>((len + chunk - 1) / chunk);
  auto op = make_op(name, std::move(done), timeout, parts);
  KeyClaim claim{src.key_id, src.secret, src.addr, src.length, *rkey};
  std::vector<WorkItem> items;
  for (uint32_t i = 0; i < parts; ++i) {
    WorkItem it;
    it.op = op;
    it.kind = Kind::kRead;
    it.key = claim;
    uint64_t off = uint64_t{i} * chunk;
    it.length = static_cast<uint32_t>(std::min<uint64_t>(chunk, len - off));
    it.local = addr_of(dst) + off;
    it.lkey = mr->lkey;
    it.remote = src.addr + src_offset + off;
    it.rkey = *rkey;
    items.push_back(std::move(it));
  }
  submit(std::move(items), op);
}

void VerbsChannel::send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) {
  trace_op(done, "message", *this, bytes.size());
  const char* name = "send message";
  counters_->add_message_sent(bytes.size());
  if (!error_.ok()) return reject(std::move(done), error_.for_op(name));
  if (bytes.size() > kMaxMessageBytes) {
    return reject(std::move(done), RDMAFLOW_ERROR(Code::kInvalidArgument, name, peer_rank(),
                                                  "message of " + std::to_string(bytes.size()) +
                                                      " bytes exceeds the verbs limit of " +
                                                      std::to_string(kMaxMessageBytes)));
  }
  size_t frag = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    frag = send_buf_size_ > kMsgHeaderSize ? send_buf_size_ - kMsgHeaderSize : 0;
  }
  if (frag == 0) {
    return reject(std::move(done), RDMAFLOW_ERROR(Code::kCancelled, name, peer_rank(),
                                                  "the channel is not connected"));
  }
  auto payload = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  auto plan = plan_fragments(payload->size(), frag);
  auto op = make_op(name, std::move(done), timeout, static_cast<uint32_t>(plan.size()));
  std::vector<WorkItem> items;
  items.reserve(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    WorkItem it;
    it.op = op;
    it.kind = Kind::kSend;
    it.payload = payload;
    it.frag_offset = plan[i].first;
    it.length = static_cast<uint32_t>(plan[i].second);
    it.last = i + 1 == plan.size();
    items.push_back(std::move(it));
  }
  submit(std::move(items), op);
}

void VerbsChannel::submit(std::vector<WorkItem> items, const std::shared_ptr<Op>& op) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) {
      finish_op_locked(op.get(), error_.get(), out);
    } else {
      op->peer = peer_rank_;
      pending_.add(op.get());
      if (!items.empty() && items.front().key) request_key_check_locked(*items.front().key);
      for (auto& it : items) {
        uint32_t slots = 1;
        if (it.kind == Kind::kWrite && it.notify && *it.notify > kMaxInlineNotify) slots = 2;
        window_.push(std::move(it), slots);
      }
      pump_locked(out);
    }
  }
  run_tasks(out);
}

// ---------------------------------------------------------------- posting

bool VerbsChannel::resources_ready(const WorkItem& item) const {
  if (item.key) {
    auto it = keys_.find(*item.key);
    if (it == keys_.end() || !it->second.valid) return false;  // awaiting the verdict
  }
  switch (item.kind) {
    case Kind::kSend:
      return credits_.can_send() && !free_bufs_.empty();
    case Kind::kWrite:
      return !item.notify || credits_.can_send();
    case Kind::kRead:
      return true;
  }
  return false;
}

void VerbsChannel::pump_locked(Tasks& out) {
  if (!connected_ || !error_.ok() || qp_ == nullptr) return;
  // Credit returns first: ordinary traffic may be waiting for the peer's credits,
  // and the peer's for ours.
  if (credits_.credit_message_due() && window_.free_slots() >= 1 && !free_bufs_.empty()) {
    post_credit_message_locked(out);
  }
  // A head whose verdict was dropped (revoked) asks again.
  if (const WorkItem* head = window_.front(); head && head->key && !keys_.count(*head->key)) {
    request_key_check_locked(*head->key);
  }
  while (!control_out_.empty() && error_.ok() && window_.free_slots() >= 1 && !free_bufs_.empty() &&
         credits_.can_send()) {
    Control c = std::move(control_out_.front());
    control_out_.pop_front();
    post_control_locked(c, out);
  }
  while (error_.ok()) {
    auto next = window_.pop_ready([&](const WorkItem& it) { return resources_ready(it); });
    if (!next) break;
    post_item_locked(std::move(next->first), next->second, out);
  }
}

bool VerbsChannel::post_locked(ibv_send_wr* wr, const char* what, Tasks& out) {
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_, wr, &bad);
  if (rc == 0) return true;
  fail_locked(RDMAFLOW_ERROR(Code::kPeerFailed, what, peer_rank_,
                             std::string("ibv_post_send failed: ") + std::strerror(rc) +
                                 "; the channel is unusable"),
              out);
  return false;
}

void VerbsChannel::post_item_locked(WorkItem item, uint32_t slots, Tasks& out) {
  uint64_t wr_id = next_wr_id_++;
  InFlight f{item.op, slots, -1};
  ibv_send_wr wr[2]{};
  ibv_sge sge[2]{};
  ibv_send_wr* head = &wr[1];
  ibv_send_wr& main = wr[1];
  main.wr_id = wr_id;
  main.send_flags = IBV_SEND_SIGNALED;
  main.sg_list = &sge[1];
  main.num_sge = 1;
  sge[1].addr = item.local;
  sge[1].length = item.length;
  sge[1].lkey = item.lkey;

  switch (item.kind) {
    case Kind::kWrite: {
      main.wr.rdma.remote_addr = item.remote;
      main.wr.rdma.rkey = remote_rkey_locked(item);
      if (item.length == 0) main.num_sge = 0;
      if (!item.notify) {
        main.opcode = IBV_WR_RDMA_WRITE;
        break;
      }
      auto enc = encoder_.encode(*item.notify);
      if (!enc.is_ok()) {  // the peer's hello always offers a ring; defensive
        window_.release(slots);
        finish_op_locked(item.op.get(), enc.status(), out);
        return;
      }
      credits_.consume(false);
      main.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      main.imm_data = htonl(enc->imm);
      if (enc->ring_slot) {
        // Value first, into the peer's ring slot; RC keeps the two in order.
        uint32_t slot = *enc->ring_slot;
        auto* staging = reinterpret_cast<uint64_t*>(send_mem_);
        staging[slot] = *item.notify;
        wr[0].wr_id = wr_id;
        wr[0].opcode = IBV_WR_RDMA_WRITE;
        wr[0].send_flags = 0;  // its slot is released with the signaled WRITE_WITH_IMM
        wr[0].sg_list = &sge[0];
        wr[0].num_sge = 1;
        sge[0].addr = addr_of(&staging[slot]);
        sge[0].length = sizeof(uint64_t);
        sge[0].lkey = send_mr_->lkey;
        wr[0].wr.rdma.remote_addr = peer_.ring_addr + uint64_t{slot} * sizeof(uint64_t);
        wr[0].wr.rdma.rkey = peer_.ring_rkey;
        wr[0].next = &main;
        head = &wr[0];
      }
      break;
    }
    case Kind::kRead:
      main.opcode = IBV_WR_RDMA_READ;
      main.wr.rdma.remote_addr = item.remote;
      main.wr.rdma.rkey = remote_rkey_locked(item);
      break;
    case Kind::kSend: {
      int buf = free_bufs_.back();
      free_bufs_.pop_back();
      f.send_buf = buf;
      uint8_t* p = send_mem_ + size_t{peer_.ring_slots} * sizeof(uint64_t) +
                   size_t{static_cast<uint32_t>(buf)} * send_buf_size_;
      MsgHeader h;
      h.type = MsgType::kData;
      h.last = item.last;
      h.credits = credits_.take_owed();
      h.encode(p);
      if (item.length > 0) {
        std::memcpy(p + kMsgHeaderSize, item.payload->data() + item.frag_offset, item.length);
      }
      credits_.consume(false);
      main.opcode = IBV_WR_SEND;
      sge[1].addr = addr_of(p);
      sge[1].length = static_cast<uint32_t>(kMsgHeaderSize + item.length);
      sge[1].lkey = send_mr_->lkey;
      break;
    }
  }
  if (!post_locked(head, item.op->name(), out)) {
    finish_op_locked(item.op.get(), error_.get(), out);
    return;
  }
  ++item.op->parts_posted;
  inflight_[wr_id] = std::move(f);
}

void VerbsChannel::post_credit_message_locked(Tasks& out) {
  if (!window_.try_reserve(1)) return;
  int buf = free_bufs_.back();
  free_bufs_.pop_back();
  uint8_t* p = send_mem_ + size_t{peer_.ring_slots} * sizeof(uint64_t) +
               size_t{static_cast<uint32_t>(buf)} * send_buf_size_;
  MsgHeader h;
  h.type = MsgType::kCredit;
  h.last = true;
  h.credits = credits_.take_owed();
  h.encode(p);
  credits_.consume(true);
  uint64_t wr_id = next_wr_id_++;
  ibv_sge sge{addr_of(p), static_cast<uint32_t>(kMsgHeaderSize), send_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (!post_locked(&wr, "return receive credits", out)) return;
  inflight_[wr_id] = InFlight{nullptr, 1, buf};
}

void VerbsChannel::post_control_locked(const Control& c, Tasks& out) {
  if (c.bind != nullptr) return post_bind_locked(c, out);
  if (!window_.try_reserve(1)) return;
  int buf = free_bufs_.back();
  free_bufs_.pop_back();
  uint8_t* p = send_mem_ + size_t{peer_.ring_slots} * sizeof(uint64_t) +
               size_t{static_cast<uint32_t>(buf)} * send_buf_size_;
  MsgHeader h;
  h.type = c.type;
  h.last = true;
  h.credits = credits_.take_owed();
  h.encode(p);
  size_t n = std::min<size_t>(c.payload.size(), send_buf_size_ - kMsgHeaderSize);
  std::memcpy(p + kMsgHeaderSize, c.payload.data(), n);
  credits_.consume(false);
  uint64_t wr_id = next_wr_id_++;
  ibv_sge sge{addr_of(p), static_cast<uint32_t>(kMsgHeaderSize + n), send_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (!post_locked(&wr, "send control message", out)) return;
  inflight_[wr_id] = InFlight{nullptr, 1, buf};
}

void VerbsChannel::request_key_check_locked(const KeyClaim& claim) {
  if (keys_.count(claim)) return;
  uint64_t request = next_key_request_++;
  keys_[claim] = KeyState{false, request};
  key_requests_[request] = claim;
  control_out_.push_back({MsgType::kKeyCheck, KeyCheck{request, claim}.encode()});
}

void VerbsChannel::announce_revoked(uint64_t key_id) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop_windows_locked(key_id);  // the NIC refuses the key from now on
    if (!error_.ok() || !connected_) return;
    control_out_.push_back({MsgType::kKeyRevoked, KeyRevoked{key_id}.encode()});
    pump_locked(out);
  }
  run_tasks(out);
}

// ---------------------------------------------------------------- completions

void VerbsChannel::poll_send_cq() {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (send_cq_ == nullptr) return;
    ibv_wc wc[16];
    for (;;) {
      int n = ibv_poll_cq(send_cq_, 16, wc);
      if (n < 0) {
        fail_locked(RDMAFLOW_ERROR(Code::kInternal, "poll completions", peer_rank_,
                                   "ibv_poll_cq failed on the send completion queue"),
                    out);
        break;
      }
      for (int i = 0; i < n; ++i) on_send_wc_locked(wc[i], out);
      if (n < 16) break;
    }
    pump_locked(out);
  }
  run_tasks(out);
}

void VerbsChannel::on_send_wc_locked(const ibv_wc& wc, Tasks& out) {
  auto it = inflight_.find(wc.wr_id);
  if (it == inflight_.end()) return;  // flushed after the channel failed
  InFlight f = std::move(it->second);
  inflight_.erase(it);
  if (!window_.release(f.slots)) {
    RDMAFLOW_LOG_ERROR("verbs: send window bookkeeping error on channel to rank {}", peer_rank_);
  }
  if (f.send_buf >= 0) free_bufs_.push_back(f.send_buf);
  if (wc.status != IBV_WC_SUCCESS) {
    if (!error_.ok()) return;
    const char* what = f.op ? f.op->name() : "return receive credits";
    Status err = RDMAFLOW_ERROR(
        Code::kPeerFailed, what, peer_rank_,
        wc_error(wc) + "; the channel to peer rank " + std::to_string(peer_rank_) + " is closed");
    if (f.op) finish_op_locked(f.op.get(), err, out);
    fail_locked(err, out);
    return;
  }
  if (f.op && ++f.op->parts_done == f.op->parts_total) {
    finish_op_locked(f.op.get(), Status::ok(), out);
  }
}

}  // namespace rdmaflow::verbs
