// VerbsChannel: creation and the connection hello, failure (sticky), close,
// timeouts, callbacks and teardown. Issuing and posting work requests is in
// verbs_send.cc, receive completions and control messages in verbs_recv.cc.
#include "transport/verbs/verbs_channel.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "transport/verbs/verbs_channel_internal.h"

namespace rdmaflow::verbs {

std::string wc_error(const ibv_wc& wc) {
  char vendor[32];
  std::snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
  std::string out = std::string("work completion error '") + ibv_wc_status_str(wc.status) +
                    "' (status " + std::to_string(static_cast<int>(wc.status)) + ", vendor error " +
                    vendor + ")";
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      out +=
          ": the peer stopped acknowledging (process gone, link down, a GID / MTU "
          "mismatch, or the peer revoked the grant this operation accessed)";
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

VerbsChannel::VerbsChannel(std::shared_ptr<VerbsCore> core)
    : core_(std::move(core)),
      local_credits_(core_->config().recv_credits),
      window_(core_->sq_depth()),
      credits_(0, local_credits_),
      reassembler_(core_->config().max_message) {}

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
  return set_peer_locked(peer);
}

Status VerbsChannel::set_peer_locked(const Hello& peer) {
  peer_ = peer;
  peer_rank_ = peer.rank;
  inbox_.set_peer(peer.rank);
  bind_counters("verbs", peer.rank);
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

// ---------------------------------------------------------------- authentication

void VerbsChannel::expect_proof(std::unique_ptr<auth::Acceptor> acceptor, std::string who,
                                std::function<void()> on_authenticated) {
  std::lock_guard<std::mutex> lock(mu_);
  acceptor_ = std::move(acceptor);
  who_ = std::move(who);
  on_authenticated_ = std::move(on_authenticated);
}

void VerbsChannel::queue_proof(std::span<const uint8_t> proof) {
  std::lock_guard<std::mutex> lock(mu_);
  control_out_.push_front({MsgType::kAuth, AuthProof::encode(proof, local_hello())});
}

Status VerbsChannel::set_remote_access(bool allow) {
  std::lock_guard<std::mutex> lock(mu_);
  return set_remote_access_locked(allow);
}

Status VerbsChannel::set_remote_access_locked(bool allow) {
  if (qp_ == nullptr) return Status::ok();
  ibv_qp_attr attr{};
  attr.qp_access_flags = allow ? (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : 0;
  if (int rc = ibv_modify_qp(qp_, &attr, IBV_QP_ACCESS_FLAGS); rc != 0) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "accept", peer_rank_,
                          std::string("ibv_modify_qp(remote access ") + (allow ? "on" : "off") +
                              ") failed: " + std::strerror(rc));
  }
  return Status::ok();
}

bool VerbsChannel::ready_to_accept() const {
  std::lock_guard<std::mutex> lock(mu_);
  // A channel that failed after the proof is handed out too: its first wait
  // reports the failure, naming the (authenticated) peer.
  return acceptor_ == nullptr && connected_ && cm_established_;
}

int VerbsChannel::peer_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_rank_;
}

Status VerbsChannel::error() const {
  return error_.get();
}

// ---------------------------------------------------------------- failure

void VerbsChannel::finish_op_locked(Op* op, const Status& status, Tasks& out) {
  if (op == nullptr || !pending_.complete(op)) return;
  counters_->add_result(status);
  Status st = status.is_ok() ? status : status.with_op(op->name());
  out.push_back([done = std::move(op->done), st = std::move(st)] {
    if (done) done(st);
  });
}

void VerbsChannel::fail_locked(Status error, Tasks& out) {
  if (!error_.set(error)) return;          // the first failure is the one reported
  if (error.code() == Code::kCancelled) {  // closed or shut down here: the usual end
    RDMAFLOW_LOG_DEBUG("verbs: channel to rank {} ends: {}", peer_rank_, error.to_string());
  } else {
    RDMAFLOW_LOG_WARN("verbs: channel to rank {} failed: {}", peer_rank_, error.to_string());
  }
  pending_.for_each([&](Op& op) { finish_op_locked(&op, error, out); });
  inflight_.clear();
  window_.take_all();
  if (qp_ != nullptr) {
    // No late DMA into memory whose operation was just reported.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  }
  release_recv_reservation_locked();
  // Tell the peer, as a TCP close would: its operations fail now with
  // RDMA_CM_EVENT_DISCONNECTED instead of waiting for their own timeouts.
  if ((connected_ || acceptor_ != nullptr) && !closed_ && id_ != nullptr) {
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
    fail_locked(acceptor_ != nullptr ? RDMAFLOW_ERROR(Code::kUnauthenticated, "accept", -1,
                                                      "refused " + who_ + ": it left (" + event +
                                                          ") before proving the job secret")
                                     : RDMAFLOW_ERROR(Code::kPeerFailed, "channel", peer_rank_,
                                                      "peer rank " + std::to_string(peer_rank_) +
                                                          " disconnected (" + event + ")"),
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
    if (!error_.ok()) return;
    bool expired = false;
    pending_.sweep(
        now,
        [](const Op& op) -> std::string_view {
          return op.parts_posted > 0
                     ? "posted; a posted RDMA operation cannot be recalled: it may still complete"
                     : "not started: waiting for send-queue slots, receive credits or the peer's "
                       "verdict on the remote key";
        },
        [&](Op& op, Status timeout) {
          finish_op_locked(&op, timeout, out);
          expired = true;
          return true;
        });
    // Their parts not yet posted are withdrawn; a half-sent message keeps its
    // remaining fragments queued so the peer's message stream stays whole.
    // Posted parts stay in flight: their late completions find the op completed.
    if (expired) {
      window_.remove_if([&](const WorkItem& it) {
        return it.op->completed && it.op->overdue(now) &&
               !(it.kind == Kind::kSend && it.op->parts_posted > 0);
      });
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
  error_.set(RDMAFLOW_ERROR(Code::kCancelled, "channel", peer_rank_, "the transport shut down"));
  release_recv_reservation_locked();
  drop_windows_locked(std::nullopt);  // before the queue pair they are bound on
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
