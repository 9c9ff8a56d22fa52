#include "transport/verbs/verbs_channel.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow::verbs {

namespace {

std::string wc_error(const ibv_wc& wc) {
  char vendor[32];
  std::snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
  std::string out = std::string("work completion error '") + ibv_wc_status_str(wc.status) +
                    "' (status " + std::to_string(static_cast<int>(wc.status)) + ", vendor error " +
                    vendor + ")";
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      out +=
          ": the peer stopped acknowledging (process gone, link down, or a GID / MTU "
          "mismatch)";
      break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      out += ": the peer had no receive buffer posted";
      break;
    case IBV_WC_REM_ACCESS_ERR:
      out += ": the peer refused the access (memory deregistered or outside its region)";
      break;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      out += ": local memory is not registered for this access";
      break;
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_LOC_LEN_ERR:
      out += ": a message did not fit the receiver's buffer";
      break;
    default:
      break;
  }
  return out;
}

uint64_t addr_of(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

std::string range_text(uint64_t offset, uint64_t len) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
         std::to_string(len) + ")";
}

}  // namespace

VerbsChannel::VerbsChannel(std::shared_ptr<VerbsCore> core)
    : core_(std::move(core)),
      local_credits_(core_->config().recv_credits),
      window_(core_->sq_depth()),
      credits_(0, local_credits_) {}

VerbsChannel::~VerbsChannel() {
  destroy_resources();
}

Result<std::shared_ptr<VerbsChannel>> VerbsChannel::create(std::shared_ptr<VerbsCore> core,
                                                           rdma_cm_id* id) {
  const char* op = "create queue pair";
  std::shared_ptr<VerbsChannel> ch(new VerbsChannel(core));
  ch->id_ = id;
  if (id->verbs != core->context()) {
    std::string got = id->verbs ? ibv_get_device_name(id->verbs->device) : "none";
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, -1,
                          "the connection goes through RDMA device '" + got +
                              "', but this transport uses '" + core->port().device +
                              "' (RDMAFLOW_IB_DEVICE / the listen address)");
  }
  // Until create() succeeds the caller owns `id`; destroy_resources() leaves it alone.
  auto fail = [&](const std::string& call, int err) {
    ch->destroy_resources();
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, -1,
                          call + " failed: " + std::strerror(err));
  };
  uint32_t depth = core->sq_depth();
  ch->send_cq_ =
      ibv_create_cq(core->context(), static_cast<int>(depth), nullptr, core->comp_channel(), 0);
  if (ch->send_cq_ == nullptr) return fail("ibv_create_cq", errno);
  if (int rc = ibv_req_notify_cq(ch->send_cq_, 0); rc != 0) return fail("ibv_req_notify_cq", rc);

  ibv_qp_init_attr attr{};
  attr.send_cq = ch->send_cq_;
  attr.recv_cq = core->recv_cq();
  attr.srq = core->srq();
  attr.cap.max_send_wr = depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_wr = 0;
  attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;
  if (rdma_create_qp(id, core->pd(), &attr) != 0) return fail("rdma_create_qp", errno);
  ch->qp_ = id->qp;
  ch->qp_num_ = id->qp->qp_num;

  size_t ring_bytes = size_t{ch->local_credits_} * sizeof(uint64_t);
  ch->ring_ = static_cast<uint64_t*>(std::aligned_alloc(64, (ring_bytes + 63) / 64 * 64));
  if (ch->ring_ == nullptr) return fail("allocate notify ring", ENOMEM);
  std::memset(ch->ring_, 0, ring_bytes);
  ch->ring_mr_ = ibv_reg_mr(core->pd(), ch->ring_, ring_bytes,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (ch->ring_mr_ == nullptr) return fail("ibv_reg_mr(notify ring)", errno);

  if (Status st = core->reserve_recv_buffers(ch->local_credits_); !st.is_ok()) {
    ch->destroy_resources();
    return st.with_op(op);
  }
  ch->recv_reserved_ = true;
  ch->owns_id_ = true;
  return ch;
}

Hello VerbsChannel::local_hello() const {
  Hello h;
  h.rank = core_->rank();
  h.credits = local_credits_;
  h.msg_size = core_->recv_buffer_size();
  h.ring_slots = local_credits_;
  h.ring_rkey = ring_mr_ ? ring_mr_->rkey : 0;
  h.ring_addr = addr_of(ring_);
  return h;
}

Status VerbsChannel::set_peer(const Hello& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_ = peer;
  peer_rank_ = peer.rank;
  inbox_.set_peer(peer.rank);
  credits_.open_peer_window(peer.credits);
  encoder_ = NotifyEncoder(peer.ring_slots);
  // A SEND never exceeds the peer's buffer; ours bounds our memory.
  send_buf_size_ = std::min(peer.msg_size, core_->recv_buffer_size());
  send_buf_count_ = std::min<uint32_t>(core_->sq_depth(), 2 * peer.credits);
  size_t staging = size_t{peer.ring_slots} * sizeof(uint64_t);
  size_t bytes = staging + size_t{send_buf_count_} * send_buf_size_;
  send_mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (send_mem_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "connect", peer.rank,
                          "out of memory for " + std::to_string(bytes) + " bytes of send buffers");
  }
  send_mr_ = ibv_reg_mr(core_->pd(), send_mem_, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (send_mr_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "connect", peer.rank,
                          std::string("ibv_reg_mr(send buffers) failed: ") + std::strerror(errno));
  }
  free_bufs_.clear();
  for (int i = static_cast<int>(send_buf_count_) - 1; i >= 0; --i) free_bufs_.push_back(i);
  return Status::ok();
}

void VerbsChannel::mark_connected() {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connected_ = true;
    pump_locked(out);
  }
  run_tasks(out);
}

int VerbsChannel::peer_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_rank_;
}

Status VerbsChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// ---------------------------------------------------------------- issuing

std::shared_ptr<VerbsChannel::Op> VerbsChannel::make_op(const char* name, Callback done,
                                                        Millis timeout, uint32_t parts) {
  auto op = std::make_shared<Op>();
  op->name = name;
  op->done = std::move(done);
  op->timeout = timeout.count() > 0 ? timeout : default_timeout();
  op->deadline = Clock::now() + op->timeout;
  op->parts_total = parts;
  return op;
}

void VerbsChannel::reject(Callback done, Status status) {
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
  const char* name = "write";
  if (Status st = error(); !st.is_ok()) return reject(std::move(done), st.with_op(name));
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
  const char* name = "read";
  if (Status st = error(); !st.is_ok()) return reject(std::move(done), st.with_op(name));
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
  const char* name = "send message";
  if (Status st = error(); !st.is_ok()) return reject(std::move(done), st.with_op(name));
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
    if (!error_.is_ok()) {
      finish_op_locked(op, error_, out);
    } else {
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
  if (!connected_ || !error_.is_ok() || qp_ == nullptr) return;
  // Credit returns first: ordinary traffic may be waiting for the peer's credits,
  // and the peer's for ours.
  if (credits_.credit_message_due() && window_.free_slots() >= 1 && !free_bufs_.empty()) {
    post_credit_message_locked(out);
  }
  // A head whose verdict was dropped (revoked) asks again.
  if (const WorkItem* head = window_.front(); head && head->key && !keys_.count(*head->key)) {
    request_key_check_locked(*head->key);
  }
  while (!control_out_.empty() && error_.is_ok() && window_.free_slots() >= 1 &&
         !free_bufs_.empty() && credits_.can_send()) {
    Control c = std::move(control_out_.front());
    control_out_.pop_front();
    post_control_locked(c, out);
  }
  while (error_.is_ok()) {
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
      main.wr.rdma.rkey = item.rkey;
      if (item.length == 0) main.num_sge = 0;
      if (!item.notify) {
        main.opcode = IBV_WR_RDMA_WRITE;
        break;
      }
      auto enc = encoder_.encode(*item.notify);
      if (!enc.is_ok()) {  // the peer's hello always offers a ring; defensive
        window_.release(slots);
        finish_op_locked(item.op, enc.status().with_op(item.op->name), out);
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
      main.wr.rdma.rkey = item.rkey;
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
  if (!post_locked(head, item.op->name.c_str(), out)) {
    finish_op_locked(item.op, error_.with_op(item.op->name), out);
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

void VerbsChannel::on_control_locked(const MsgHeader& h, std::span<const uint8_t> payload,
                                     Tasks& out) {
  switch (h.type) {
    case MsgType::kKeyCheck: {
      auto check = KeyCheck::decode(payload, peer_rank_);
      if (!check.is_ok()) return fail_locked(check.status(), out);
      Status verdict = core_->check_claim(check->claim, peer_rank_);
      KeyVerdict v{check->request, verdict.code(), verdict.reason()};
      control_out_.push_back({MsgType::kKeyVerdict, v.encode()});
      return;
    }
    case MsgType::kKeyVerdict: {
      auto v = KeyVerdict::decode(payload, peer_rank_);
      if (!v.is_ok()) return fail_locked(v.status(), out);
      auto req = key_requests_.find(v->request);
      if (req == key_requests_.end()) {
        return fail_locked(
            RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer_rank_,
                           "verdict for unknown key check " + std::to_string(v->request)),
            out);
      }
      KeyClaim claim = req->second;
      key_requests_.erase(req);
      auto state = keys_.find(claim);
      if (v->code == Code::kOk) {
        if (state != keys_.end() && state->second.request == v->request) state->second.valid = true;
        return;
      }
      if (state != keys_.end() && state->second.request == v->request) keys_.erase(state);
      auto refused = window_.remove_if([&](const WorkItem& it) {
        return it.key && *it.key == claim && it.op->parts_posted == 0;
      });
      for (auto& it : refused) {
        finish_op_locked(it.op,
                         Status(v->code, it.op->name, peer_rank_,
                                "peer rank " + std::to_string(peer_rank_) +
                                    " refused the remote key: " + v->reason),
                         out);
      }
      return;
    }
    case MsgType::kKeyRevoked: {
      auto r = KeyRevoked::decode(payload, peer_rank_);
      if (!r.is_ok()) return fail_locked(r.status(), out);
      std::erase_if(keys_,
                    [&](const auto& e) { return e.first.key_id == r->key_id && e.second.valid; });
      return;
    }
    default:
      return;
  }
}

void VerbsChannel::announce_revoked(uint64_t key_id) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.is_ok() || !connected_) return;
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
    if (!error_.is_ok()) return;
    std::string what = f.op ? f.op->name : std::string("return receive credits");
    Status err = RDMAFLOW_ERROR(
        Code::kPeerFailed, what, peer_rank_,
        wc_error(wc) + "; the channel to peer rank " + std::to_string(peer_rank_) + " is closed");
    if (f.op) finish_op_locked(f.op, err, out);
    fail_locked(err, out);
    return;
  }
  if (f.op && ++f.op->parts_done == f.op->parts_total) finish_op_locked(f.op, Status::ok(), out);
}

void VerbsChannel::handle_recv(const ibv_wc& wc) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool live = error_.is_ok() && qp_ != nullptr;
    const uint8_t* buf = core_->recv_buffer(wc.wr_id);
    if (wc.status != IBV_WC_SUCCESS) {
      if (live && wc.status != IBV_WC_WR_FLUSH_ERR) {
        fail_locked(RDMAFLOW_ERROR(Code::kPeerFailed, "receive", peer_rank_, wc_error(wc)), out);
      }
    } else if (live && buf != nullptr) {
      Status bad;
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        auto dec = decode_imm(ntohl(wc.imm_data), local_credits_, peer_rank_);
        if (!dec.is_ok()) {
          bad = dec.status();
        } else {
          uint64_t value = dec->value;
          if (dec->ring_slot) value = reinterpret_cast<volatile uint64_t*>(ring_)[*dec->ring_slot];
          out.push_back([self = shared_from_this(), value] { self->inbox_.push_notify(value); });
        }
      } else if (wc.opcode == IBV_WC_RECV) {
        std::span<const uint8_t> bytes(buf,
                                       std::min<size_t>(wc.byte_len, core_->recv_buffer_size()));
        auto h = MsgHeader::decode(bytes, peer_rank_);
        if (!h.is_ok()) {
          bad = h.status();
        } else if (!credits_.grant(h->credits)) {
          bad =
              RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer_rank_,
                             "peer returned " + std::to_string(h->credits) + " credits but only " +
                                 std::to_string(credits_.peer_window() - credits_.available()) +
                                 " are outstanding");
        } else if (h->type == MsgType::kData) {
          auto msg = reassembler_.add(bytes.subspan(kMsgHeaderSize), h->last, peer_rank_);
          if (!msg.is_ok()) {
            bad = msg.status();
          } else if (msg->has_value()) {
            out.push_back([self = shared_from_this(), m = std::move(**msg)]() mutable {
              self->inbox_.push_message(std::move(m));
            });
          }
        } else if (h->type != MsgType::kCredit) {
          on_control_locked(*h, bytes.subspan(kMsgHeaderSize), out);
        }
      } else {
        bad = RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_rank_,
                             "unexpected receive opcode " + std::to_string(wc.opcode));
      }
      if (!bad.is_ok()) fail_locked(bad, out);
    }
    if (Status st = core_->repost_recv(wc.wr_id); !st.is_ok()) {
      fail_locked(st, out);
    } else if (live && error_.is_ok()) {
      credits_.on_buffer_reposted();
    }
    pump_locked(out);
  }
  run_tasks(out);
}

// ---------------------------------------------------------------- failure

void VerbsChannel::finish_op_locked(const std::shared_ptr<Op>& op, const Status& status,
                                    Tasks& out) {
  if (!op || op->finished) return;
  op->finished = true;
  Status st = status.is_ok() ? status : status.with_op(op->name);
  out.push_back([done = std::move(op->done), st = std::move(st)] {
    if (done) done(st);
  });
}

void VerbsChannel::fail_locked(Status error, Tasks& out) {
  if (!error_.is_ok()) return;
  error_ = error;
  if (error.code() == Code::kCancelled) {  // closed or shut down here: the usual end
    RDMAFLOW_LOG_DEBUG("verbs: channel to rank {} ends: {}", peer_rank_, error.to_string());
  } else {
    RDMAFLOW_LOG_WARN("verbs: channel to rank {} failed: {}", peer_rank_, error.to_string());
  }
  for (auto& [id, f] : inflight_) finish_op_locked(f.op, error, out);
  inflight_.clear();
  for (auto& item : window_.take_all()) finish_op_locked(item.op, error, out);
  if (qp_ != nullptr) {
    // No late DMA into memory whose operation was just reported.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  }
  release_recv_reservation_locked();
  // Tell the peer, as a TCP close would: its operations fail now with
  // RDMA_CM_EVENT_DISCONNECTED instead of waiting for their own timeouts.
  if (connected_ && !closed_ && id_ != nullptr) {
    closed_ = true;
    // The passive side can fail on a message that overtook the RTU; the CM
    // sends no DREQ before it is ESTABLISHED (rdma_disconnect still returns
    // 0), so that disconnect waits for the ESTABLISHED event.
    if (cm_established_) {
      rdma_disconnect(id_);
    } else {
      disconnect_deferred_ = true;
    }
  }
  out.push_back([self = shared_from_this(), error] { self->inbox_.fail(error); });
}

void VerbsChannel::release_recv_reservation_locked() {
  if (!recv_reserved_) return;
  recv_reserved_ = false;
  core_->release_recv_buffers(local_credits_);
}

void VerbsChannel::fail(Status error) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(std::move(error), out);
  }
  run_tasks(out);
}

void VerbsChannel::on_disconnected(const std::string& event) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(
        RDMAFLOW_ERROR(Code::kPeerFailed, "channel", peer_rank_,
                       "peer rank " + std::to_string(peer_rank_) + " disconnected (" + event + ")"),
        out);
    if (!closed_ && id_ != nullptr) {
      closed_ = true;
      rdma_disconnect(id_);  // completes the disconnect handshake; errors are moot now
    }
  }
  run_tasks(out);
}

void VerbsChannel::on_established() {
  std::lock_guard<std::mutex> lock(mu_);
  cm_established_ = true;
  if (!disconnect_deferred_ || id_ == nullptr) return;
  disconnect_deferred_ = false;
  rdma_disconnect(id_);
}

void VerbsChannel::close() {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    fail_locked(RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_rank_,
                               "the channel to peer rank " + std::to_string(peer_rank_) +
                                   " was closed locally"),
                out);
    if (connected_ && id_ != nullptr) rdma_disconnect(id_);
  }
  run_tasks(out);
}

void VerbsChannel::check_timeouts(Clock::time_point now) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.is_ok()) return;
    auto late = [&](const Op& op, bool started) {
      std::string ms = std::to_string(op.timeout.count());
      return RDMAFLOW_ERROR(
          Code::kTimeout, op.name, peer_rank_,
          started ? "no completion within " + ms +
                        " ms (a posted RDMA operation cannot be recalled: it may still complete)"
                  : "not started within " + ms +
                        " ms: waiting for send-queue slots, receive credits or the peer's "
                        "verdict on the remote key");
    };
    // Not started: withdrawn. Half-sent messages keep their remaining fragments
    // queued so the peer's message stream stays whole.
    auto expired = window_.remove_if([&](const WorkItem& it) {
      return it.op->deadline <= now && !(it.kind == Kind::kSend && it.op->parts_posted > 0);
    });
    for (auto& it : expired) finish_op_locked(it.op, late(*it.op, it.op->parts_posted > 0), out);
    window_.for_each([&](const WorkItem& it) {
      if (!it.op->finished && it.op->deadline <= now)
        finish_op_locked(it.op, late(*it.op, true), out);
    });
    // Posted: reported now; the late completion is dropped (the op is finished).
    for (auto& [id, f] : inflight_) {
      if (f.op && !f.op->finished && f.op->deadline <= now) {
        finish_op_locked(f.op, late(*f.op, true), out);
      }
    }
  }
  run_tasks(out);
}

void VerbsChannel::run_tasks(Tasks& tasks) {
  if (tasks.empty()) return;
  if (core_->on_progress_thread()) {
    for (auto& t : tasks) t();
  } else {
    for (auto& t : tasks) core_->defer(std::move(t));
  }
  tasks.clear();
}

// ---------------------------------------------------------------- teardown

void VerbsChannel::destroy_resources() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  if (error_.is_ok()) {
    error_ = RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_rank_, "the transport shut down");
  }
  release_recv_reservation_locked();
  if (id_ != nullptr && qp_ != nullptr) rdma_destroy_qp(id_);
  qp_ = nullptr;
  if (send_cq_ != nullptr) ibv_destroy_cq(send_cq_);
  send_cq_ = nullptr;
  if (ring_mr_ != nullptr) ibv_dereg_mr(ring_mr_);
  ring_mr_ = nullptr;
  if (send_mr_ != nullptr) ibv_dereg_mr(send_mr_);
  send_mr_ = nullptr;
  std::free(ring_);
  ring_ = nullptr;
  std::free(send_mem_);
  send_mem_ = nullptr;
  if (id_ != nullptr && owns_id_) rdma_destroy_id(id_);
  id_ = nullptr;
}

}  // namespace rdmaflow::verbs
