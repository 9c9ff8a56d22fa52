// VerbsTransport's progress thread: completions, rdma_cm events (accepting
// connections, disconnects), device events, deferred callbacks and deadlines.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/handshake.h"
#include "common/log.h"
#include "transport/verbs/verbs_address.h"
#include "transport/verbs/verbs_transport.h"
#include "transport/verbs/verbs_transport_internal.h"

namespace rdmaflow::verbs {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kTickMs = 10;
constexpr size_t kMaxRejectData = 148;  // IB CM REJ private data
}  // namespace

// ---------------------------------------------------------------- progress thread

void VerbsTransport::progress_loop() {
  core_->set_progress_thread(std::this_thread::get_id(), wake_fd_);
  pollfd fds[4] = {{core_->comp_channel()->fd, POLLIN, 0},
                   {ec_->fd, POLLIN, 0},
                   {core_->context()->async_fd, POLLIN, 0},
                   {wake_fd_, POLLIN, 0}};
  auto last_check = Clock::now();
  while (!stop_) {
    int rc = ::poll(fds, 4, kTickMs);
    if (rc < 0 && errno != EINTR) {
      RDMAFLOW_LOG_ERROR("verbs: poll failed: {}", std::strerror(errno));
    }
    if (fds[3].revents & POLLIN) {
      uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, sizeof(v));
      (void)r;
    }
    drain_cq_events();
    drain_cm_events();
    drain_async_events();
    core_->run_deferred();
    auto now = Clock::now();
    if (rc == 0 || now - last_check >= std::chrono::milliseconds(kTickMs)) {
      // Safety net for a missed CQ event, then the deadlines.
      poll_recv_cq();
      for (auto& ch : core_->channels()) ch->poll_send_cq();
      check_deadlines();
      last_check = now;
    }
  }
  core_->run_deferred();
}

void VerbsTransport::drain_cq_events() {
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  while (ibv_get_cq_event(core_->comp_channel(), &cq, &cq_ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    ibv_req_notify_cq(cq, 0);  // re-arm, then poll: nothing slips between the two
    if (cq == core_->recv_cq()) {
      poll_recv_cq();
    } else if (auto ch = core_->channel_by_cq(cq)) {
      ch->poll_send_cq();
    }
  }
}

void VerbsTransport::poll_recv_cq() {
  // Everything the receive queue holds is taken first and every revocation in
  // it applied before any completion is handled: a peer stopped or descheduled
  // while the target revoked a key finds, when it runs again, the notify that
  // wakes its caller ahead of the KeyRevoked behind it. Handled in order, the
  // caller could post a write with the dropped verdict between the two (the
  // NIC refuses it and the queue pair breaks); applied first, that write asks
  // the target again and is refused on its own. Dropping a verdict early costs
  // at most one more key check.
  recv_batch_.clear();
  ibv_wc wc[32];
  for (;;) {
    int n = ibv_poll_cq(core_->recv_cq(), 32, wc);
    if (n < 0) RDMAFLOW_LOG_ERROR("verbs: ibv_poll_cq failed on the receive CQ");
    if (n <= 0) break;
    recv_batch_.insert(recv_batch_.end(), wc, wc + n);
  }
  for (const ibv_wc& c : recv_batch_) {
    if (auto ch = core_->channel_by_qpn(c.qp_num)) ch->apply_revocation(c);
  }
  for (const ibv_wc& c : recv_batch_) {
    if (auto ch = core_->channel_by_qpn(c.qp_num)) {
      ch->handle_recv(c);
    } else if (Status st = core_->repost_recv(c.wr_id); !st.is_ok()) {
      RDMAFLOW_LOG_ERROR("verbs: {}", st.to_string());
    }
  }
}

void VerbsTransport::drain_cm_events() {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(ec_, &ev) == 0) {
    rdma_cm_id* id = ev->id;
    rdma_cm_event_type type = ev->event;
    switch (type) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        on_connect_request(ev);  // acks
        continue;
      case RDMA_CM_EVENT_ESTABLISHED:
        rdma_ack_cm_event(ev);
        on_established(id);
        continue;
      case RDMA_CM_EVENT_DISCONNECTED: {
        rdma_ack_cm_event(ev);
        if (auto ch = core_->channel_by_id(id)) ch->on_disconnected(event_name(type));
        std::lock_guard<std::mutex> lock(mu_);
        pending_.erase(id);
        continue;
      }
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE: {
        std::string why = event_name(type) + " (status " + std::to_string(ev->status) + ")";
        rdma_ack_cm_event(ev);
        drop_pending(id, RDMAFLOW_ERROR(Code::kConnectionFailed, "accept", -1,
                                        "the connection failed before it was established: " + why));
        continue;
      }
      case RDMA_CM_EVENT_DEVICE_REMOVAL: {
        rdma_ack_cm_event(ev);
        for (auto& ch : core_->channels()) {
          ch->fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", ch->peer_rank(),
                                  "the RDMA device " + core_->port().device + " was removed"));
        }
        continue;
      }
      default:
        RDMAFLOW_LOG_DEBUG("verbs: rdma_cm event {}", event_name(type));
        rdma_ack_cm_event(ev);
        continue;
    }
  }
}

void VerbsTransport::on_connect_request(rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;
  std::vector<uint8_t> pdata;
  if (ev->param.conn.private_data != nullptr) {
    const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
    pdata.assign(p, p + ev->param.conn.private_data_len);
  }
  uint8_t peer_initiator = ev->param.conn.initiator_depth;
  uint8_t peer_responder = ev->param.conn.responder_resources;
  rdma_ack_cm_event(ev);

  auto refuse = [&](const Status& why) {
    RDMAFLOW_LOG_WARN("verbs: refusing a connection: {}", why.to_string());
    std::string text = why.reason().substr(0, kMaxRejectData - 1);
    rdma_reject(id, text.c_str(), static_cast<uint8_t>(text.size() + 1));
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_) {
      refuse(RDMAFLOW_ERROR(Code::kCancelled, "accept", -1, "the transport is shutting down"));
      rdma_destroy_id(id);
      return;
    }
  }
  // The job handshake (verbs_wire.h): the connector's hello is the private data.
  const std::string who = "a verbs peer at " + describe_sockaddr(rdma_get_peer_addr(id));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.size() >= static_cast<size_t>(auth::max_pending_handshakes())) {
      refuse(RDMAFLOW_ERROR(Code::kResourceExhausted, "accept", -1,
                            "refused " + who + ": " + std::to_string(pending_.size()) +
                                " connections are already in the handshake "
                                "(RDMAFLOW_AUTH_PENDING_MAX)"));
      rdma_destroy_id(id);
      return;
    }
  }
  auto secret = load_job_secret();
  if (!secret.is_ok()) {
    refuse(secret.status());
    rdma_destroy_id(id);
    return;
  }
  auto acceptor = std::make_unique<auth::Acceptor>(std::move(secret).value(), kAuthLabel);
  const size_t hello_len = std::min(pdata.size(), auth::kHelloBytes);
  auto challenge = acceptor->challenge(std::span<const uint8_t>(pdata.data(), hello_len), who);
  if (!challenge.is_ok()) {
    refuse(challenge.status().with_op("accept"));
    rdma_destroy_id(id);
    return;
  }
  set_ack_timeout(id);
  auto created = VerbsChannel::create(core_, id);
  if (!created.is_ok()) {
    refuse(created.status());
    rdma_destroy_id(id);
    return;
  }
  auto ch = std::move(created).value();  // owns id from here
  ch->expect_proof(std::move(acceptor), who, [this, id] { promote_if_ready(id); });
  core_->add_channel(ch);
  std::vector<uint8_t> mine(challenge->begin(), challenge->end());
  const std::vector<uint8_t> hello = ch->local_hello().encode();
  mine.insert(mine.end(), hello.begin(), hello.end());
  rdma_conn_param param{};
  param.private_data = mine.data();
  param.private_data_len = static_cast<uint8_t>(mine.size());
  uint32_t rd = std::min<uint32_t>(core_->max_rd_atomic(), 255);
  param.responder_resources = static_cast<uint8_t>(std::min<uint32_t>(rd, peer_initiator));
  param.initiator_depth = static_cast<uint8_t>(std::min<uint32_t>(rd, peer_responder));
  param.rnr_retry_count = 7;
  if (rdma_accept(id, &param) != 0) {
    RDMAFLOW_LOG_WARN("verbs: rdma_accept for {} failed: {}", who, std::strerror(errno));
    core_->remove_channel(ch.get());
    ch->destroy_resources();
    return;
  }
  // rdma_accept gave the queue pair rdma_cm's access rights (remote write and
  // read); none until the peer proved the job secret. (rdma_cm re-applies its
  // rights while accepting, so this cannot come earlier: a write racing the
  // accept's reply still needs a valid rkey, which nothing has revealed.)
  if (Status st = ch->set_remote_access(false); !st.is_ok()) {
    RDMAFLOW_LOG_WARN("verbs: refusing {}: {}", who, st.to_string());
    ch->fail(st);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  pending_[id] =
      Pending{ch, Clock::now() + std::min<std::chrono::milliseconds>(config_.connect_timeout,
                                                                     auth::handshake_timeout())};
}

void VerbsTransport::on_established(rdma_cm_id* id) {
  std::shared_ptr<VerbsChannel> ch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // an active-side id migrated after its handshake
    ch = it->second.channel;
  }
  ch->on_established();
  promote_if_ready(id);
}

void VerbsTransport::promote_if_ready(rdma_cm_id* id) {
  std::shared_ptr<VerbsChannel> ch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end() || !it->second.channel->ready_to_accept()) return;
    ch = it->second.channel;
    pending_.erase(it);
    accepted_[ch->peer_rank()].push_back(ch);
  }
  cv_.notify_all();
  log_path(ch, ch->peer_rank());
}

void VerbsTransport::drop_pending(rdma_cm_id* id, const Status& why) {
  std::shared_ptr<VerbsChannel> ch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    ch = it->second.channel;
    pending_.erase(it);
  }
  ch->fail(why);
}

void VerbsTransport::drain_async_events() {
  ibv_async_event ae{};
  while (ibv_get_async_event(core_->context(), &ae) == 0) {
    std::string what = ibv_event_type_str(ae.event_type);
    switch (ae.event_type) {
      case IBV_EVENT_COMM_EST:
        // Data arrived before the CM's RTU: tell rdma_cm the connection is up.
        if (auto ch = core_->channel_by_qpn(ae.element.qp->qp_num)) {
          rdma_notify(ch->cm_id(), IBV_EVENT_COMM_EST);
        }
        break;
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        if (auto ch = core_->channel_by_qpn(ae.element.qp->qp_num)) {
          ch->fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", ch->peer_rank(),
                                  "queue pair error reported by the device: " + what));
        }
        break;
      case IBV_EVENT_DEVICE_FATAL:
      case IBV_EVENT_SRQ_ERR:
      case IBV_EVENT_CQ_ERR:
        for (auto& ch : core_->channels()) {
          ch->fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", ch->peer_rank(),
                                  "device error on " + core_->port().device + ": " + what));
        }
        break;
      case IBV_EVENT_PORT_ERR:
        RDMAFLOW_LOG_WARN("verbs: port {} of {} went down", ae.element.port_num,
                          core_->port().device);
        break;
      default:
        RDMAFLOW_LOG_DEBUG("verbs: async event {}", what);
        break;
    }
    ibv_ack_async_event(&ae);
  }
}

void VerbsTransport::check_deadlines() {
  auto now = Clock::now();
  for (auto& ch : core_->channels()) ch->check_timeouts(now);
  std::vector<std::pair<rdma_cm_id*, int>> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, p] : pending_) {
      if (p.deadline <= now) late.emplace_back(id, p.channel->peer_rank());
    }
  }
  for (auto& [id, rank] : late) {
    drop_pending(id, RDMAFLOW_ERROR(Code::kTimeout, "accept", rank,
                                    "the connection from rank " + std::to_string(rank) +
                                        " was not established in time"));
  }
}

}  // namespace rdmaflow::verbs
