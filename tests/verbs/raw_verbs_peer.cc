#include "tests/verbs/raw_verbs_peer.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "transport/verbs/verbs_address.h"

namespace rdmaflow::testing {

namespace {
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr uint64_t kSendWrId = 1;
constexpr int kRecvBuffers = 16;
constexpr size_t kBufferSize = 1 << 16;

Status failed(const std::string& what) {
  return RDMAFLOW_ERROR(Code::kConnectionFailed, "raw verbs peer", -1, what);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

RawVerbsPeer::~RawVerbsPeer() {
  if (id_ != nullptr) {
    if (qp_) {
      rdma_disconnect(id_);
      rdma_destroy_qp(id_);
    }
  }
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (id_ != nullptr) rdma_destroy_id(id_);
  if (ec_ != nullptr) rdma_destroy_event_channel(ec_);
}

Result<rdma_cm_event_type> RawVerbsPeer::next_event(Millis timeout, std::string* reject) {
  pollfd p{ec_->fd, POLLIN, 0};
  int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (n <= 0) {
    return RDMAFLOW_ERROR(Code::kTimeout, "raw verbs peer", -1,
                          "no rdma_cm event within " + std::to_string(timeout.count()) + " ms");
  }
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ec_, &ev) != 0) return failed("rdma_get_cm_event failed");
  rdma_cm_event_type type = ev->event;
  last_status_ = ev->status;
  if (type == RDMA_CM_EVENT_ESTABLISHED && ev->param.conn.private_data != nullptr) {
    const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
    accept_data_.assign(p, p + ev->param.conn.private_data_len);
  }
  if (reject != nullptr && ev->param.conn.private_data != nullptr &&
      ev->param.conn.private_data_len > 0) {
    const char* text = static_cast<const char*>(ev->param.conn.private_data);
    *reject = std::string(text, strnlen(text, ev->param.conn.private_data_len));
  }
  rdma_ack_cm_event(ev);
  return type;
}

Status RawVerbsPeer::connect(const std::string& address, std::span<const uint8_t> private_data,
                             Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  RDMAFLOW_ASSIGN_OR_RETURN(verbs::VerbsAddress to, verbs::parse_verbs_address(address));
  sockaddr_storage sa{};
  RDMAFLOW_ASSIGN_OR_RETURN(socklen_t len, verbs::to_sockaddr(to, &sa));
  (void)len;
  ec_ = rdma_create_event_channel();
  if (ec_ == nullptr) return failed("rdma_create_event_channel failed");
  if (rdma_create_id(ec_, &id_, nullptr, RDMA_PS_TCP) != 0) return failed("rdma_create_id failed");
  auto expect = [&](rdma_cm_event_type want, const char* step) -> Status {
    std::string reject;
    RDMAFLOW_ASSIGN_OR_RETURN(rdma_cm_event_type got,
                              next_event(Millis(remaining_ms(deadline)), &reject));
    if (got == want) return Status::ok();
    return failed(std::string(step) + ": " + rdma_event_str(got) + ", status " +
                  std::to_string(last_status_) + (reject.empty() ? "" : " (" + reject + ")"));
  };
  if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&sa), remaining_ms(deadline)) !=
      0) {
    return failed("rdma_resolve_addr " + address + " failed");
  }
  RDMAFLOW_RETURN_IF_ERROR(expect(RDMA_CM_EVENT_ADDR_RESOLVED, "resolve address"));
  if (rdma_resolve_route(id_, remaining_ms(deadline)) != 0) return failed("rdma_resolve_route");
  RDMAFLOW_RETURN_IF_ERROR(expect(RDMA_CM_EVENT_ROUTE_RESOLVED, "resolve route"));

  pd_ = ibv_alloc_pd(id_->verbs);
  cq_ = pd_ == nullptr ? nullptr : ibv_create_cq(id_->verbs, 2 * kRecvBuffers, nullptr, nullptr, 0);
  if (cq_ == nullptr) return failed("ibv_alloc_pd / ibv_create_cq failed");
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 4;
  attr.cap.max_recv_wr = kRecvBuffers;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id_, pd_, &attr) != 0) return failed("rdma_create_qp failed");
  qp_ = true;
  // Whatever the listener sends is received and ignored, so that it never
  // waits on receiver-not-ready retries.
  buf_.assign(kBufferSize * (kRecvBuffers + 1), 0);
  mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr_ == nullptr) return failed("ibv_reg_mr failed");
  for (int i = 0; i < kRecvBuffers; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + kBufferSize * (i + 1)),
                static_cast<uint32_t>(kBufferSize), mr_->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = 100 + static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(id_->qp, &wr, &bad) != 0) return failed("ibv_post_recv failed");
  }

  rdma_conn_param param{};
  param.private_data = private_data.data();
  param.private_data_len = static_cast<uint8_t>(private_data.size());
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id_, &param) != 0) return failed("rdma_connect failed");
  return expect(RDMA_CM_EVENT_ESTABLISHED, "connect");
}

Status RawVerbsPeer::send(std::span<const uint8_t> bytes, Millis timeout) {
  if (!qp_) return failed("send before connect");
  if (bytes.size() > kBufferSize) return failed("send of more than one buffer");
  std::memcpy(buf_.data(), bytes.data(), bytes.size());
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), static_cast<uint32_t>(bytes.size()),
              mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kSendWrId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) return failed("ibv_post_send failed");
  return wait_send(kSendWrId, timeout);
}

Status RawVerbsPeer::rdma(bool write, uint64_t addr, uint32_t rkey, uint32_t len, Millis timeout,
                          uint8_t fill) {
  if (!qp_) return failed("RDMA before connect");
  if (len > kBufferSize) return failed("RDMA of more than one buffer");
  std::memset(buf_.data(), fill, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), len, mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kSendWrId + 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) return failed("ibv_post_send failed");
  return wait_send(wr.wr_id, timeout);
}

Status RawVerbsPeer::wait_send(uint64_t wr_id, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) return failed("ibv_poll_cq failed");
    if (n == 0) continue;
    if (wc.wr_id != wr_id) {  // something the listener sent us: kept for recv()
      if (wc.wr_id >= 100) received_.push_back(wc);
      continue;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      return failed(std::string("work request completed with ") + ibv_wc_status_str(wc.status));
    }
    return Status::ok();
  }
  return RDMAFLOW_ERROR(Code::kTimeout, "raw verbs peer", -1, "work request not completed in time");
}

Result<std::vector<uint8_t>> RawVerbsPeer::recv(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  while (received_.empty() && Clock::now() < deadline) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) return failed("ibv_poll_cq failed");
    if (n == 1 && wc.wr_id >= 100) received_.push_back(wc);
  }
  if (received_.empty()) {
    return RDMAFLOW_ERROR(Code::kTimeout, "raw verbs peer", -1, "no message in time");
  }
  ibv_wc wc = received_.front();
  received_.pop_front();
  if (wc.status != IBV_WC_SUCCESS) {
    return failed(std::string("receive completed with ") + ibv_wc_status_str(wc.status));
  }
  const size_t i = wc.wr_id - 100;
  uint8_t* p = buf_.data() + kBufferSize * (i + 1);
  std::vector<uint8_t> out(p, p + std::min<size_t>(wc.byte_len, kBufferSize));
  ibv_sge sge{reinterpret_cast<uintptr_t>(p), static_cast<uint32_t>(kBufferSize), mr_->lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wc.wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_recv(id_->qp, &wr, &bad) != 0) return failed("ibv_post_recv failed");
  return out;
}

bool RawVerbsPeer::disconnected_within(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!disconnected_ && Clock::now() < deadline) {
    auto ev = next_event(Millis(std::min(remaining_ms(deadline), 100)), nullptr);
    if (ev.is_ok() && *ev == RDMA_CM_EVENT_DISCONNECTED) disconnected_ = true;
  }
  return disconnected_;
}

}  // namespace rdmaflow::testing
