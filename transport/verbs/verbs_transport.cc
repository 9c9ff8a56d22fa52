#include "transport/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/handshake.h"
#include "common/log.h"
#include "common/strings.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_address.h"
#include "transport/verbs/verbs_transport_internal.h"

namespace rdmaflow::verbs {

// Local ACK timeout exponent: 4.096 us * 2^16 = 268 ms per try, 7 tries (the
// first and kRetryCount retries), so a silently vanished peer fails a work
// request in about 2 s (a peer whose process died is usually reported sooner,
// by a DISCONNECTED event). Not shorter: with a finite retry count (below) a
// responder starved of CPU for every try, as an emulated guest under load can
// be, would fail a healthy channel. (NCCL's default, 18 with 7 retries, waits
// about 8 s.)
constexpr uint8_t kAckTimeout = 16;
// 6, not 7: the IB spec makes only rnr_retry 7 infinite, but rdma_rxe treats a
// retry_cnt of 7 as infinite too (rxe_comp.c: `if (qp->comp.retry_cnt != 7)
// qp->comp.retry_cnt--`). With 7, an RDMA read whose memory window a revoke
// deallocated mid-read retried forever: rxe's responder stops at the dead rkey
// and NAKs with the read's first PSN, which the requester, already past it,
// ignores (docs/security.md). The passive side takes the count from our
// connect request.
constexpr uint8_t kRetryCount = 6;

void set_ack_timeout(rdma_cm_id* id) {
  uint8_t t = kAckTimeout;
  if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)) != 0) {
    RDMAFLOW_LOG_DEBUG("verbs: rdma_set_option(ACK_TIMEOUT) failed: {}", std::strerror(errno));
  }
}

std::string event_name(rdma_cm_event_type e) {
  return rdma_event_str(e);
}

namespace {
using Clock = std::chrono::steady_clock;

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// The IPv4 address of interface `ifname`, if it has one.
std::optional<std::string> interface_ipv4(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (ifaddrs* a = list; a != nullptr && !out; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (ifname != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf))) out = std::string(buf);
  }
  freeifaddrs(list);
  return out;
}

// Which IP the listener binds (and connections originate from): the configured
// interface / address unless it is loopback (no RDMA netdev owns loopback),
// else the IPv4 address inside the chosen RoCE GID.
Result<std::string> choose_bind_ip(const TransportConfig& config, const PortChoice& port) {
  const char* op = "create verbs transport";
  const std::string& want = config.ifname;
  if (!want.empty() && want != "lo" && !is_loopback_ip(want)) {
    in_addr a4{};
    in6_addr a6{};
    if (inet_pton(AF_INET, want.c_str(), &a4) == 1 || inet_pton(AF_INET6, want.c_str(), &a6) == 1) {
      return want;
    }
    if (auto ip = interface_ipv4(want)) return *ip;
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "interface '" + want + "' has no IPv4 address to bind rdma_cm to");
  }
  if (!want.empty()) {
    RDMAFLOW_LOG_DEBUG("verbs: ignoring loopback interface '{}': no RDMA netdev owns it", want);
  }
  if (port.gid.ipv4) return *port.gid.ipv4;
  return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                        "the chosen GID " + port.gid.reason +
                            " holds no IPv4 address, so the IP rdma_cm should bind is unknown; "
                            "set RDMAFLOW_IB_GID_INDEX to a RoCE v2 IPv4 GID or name the "
                            "interface (TransportConfig::ifname)");
}

std::string cm_failure(const rdma_cm_event* ev, rdma_cm_event_type expected) {
  std::string out = "rdma_cm reported " + event_name(ev->event) + " (status " +
                    std::to_string(ev->status) + ") while waiting for " + event_name(expected);
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    const auto* pd = static_cast<const char*>(ev->param.conn.private_data);
    size_t len = ev->param.conn.private_data_len;
    std::string why = pd ? std::string(pd, strnlen(pd, len)) : std::string();
    if (!why.empty()) {
      out += ": the listener said: " + why;
    } else {
      out += ": nobody accepted (no rdmaflow verbs listener at that address?)";
    }
  } else if (ev->event == RDMA_CM_EVENT_ADDR_ERROR || ev->event == RDMA_CM_EVENT_ROUTE_ERROR) {
    out += ": is the address on an RDMA netdev (rdma link show)?";
  } else if (ev->event == RDMA_CM_EVENT_UNREACHABLE) {
    out += ": the peer's port does not answer (firewall on UDP 4791? MTU?)";
  }
  return out;
}

// Waits for one event of `expected` type on `ec`; the caller acks it.
Result<rdma_cm_event*> wait_cm_event(rdma_event_channel* ec, rdma_cm_event_type expected,
                                     Clock::time_point deadline, int peer,
                                     const std::string& address) {
  for (;;) {
    pollfd pfd{ec->fd, POLLIN, 0};
    int left = remaining_ms(deadline);
    int rc = ::poll(&pfd, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      return RDMAFLOW_ERROR(
          Code::kTimeout, "connect", peer,
          "no " + event_name(expected) + " from " + address + " before the deadline");
    }
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ec, &ev) != 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return RDMAFLOW_ERROR(Code::kConnectionFailed, "connect", peer,
                            std::string("rdma_get_cm_event failed: ") + std::strerror(errno));
    }
    if (ev->event == expected) return ev;
    std::string why = cm_failure(ev, expected);
    rdma_ack_cm_event(ev);
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "connect", peer, why + " (" + address + ")");
  }
}
}  // namespace

// ---------------------------------------------------------------- setup

Result<std::unique_ptr<Transport>> VerbsTransport::create(const TransportConfig& config) {
  const char* op = "create verbs transport";
  RDMAFLOW_ASSIGN_OR_RETURN(VerbsConfig vc, VerbsConfig::from_env());
  RDMAFLOW_ASSIGN_OR_RETURN(auto names, list_rdma_devices());
  if (vc.device && std::find(names.begin(), names.end(), *vc.device) == names.end()) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    return RDMAFLOW_ERROR(
        Code::kNotViable, op, -1,
        "RDMAFLOW_IB_DEVICE='" + *vc.device + "' is not an RDMA device here; found: " + all);
  }
  std::unique_ptr<VerbsTransport> t(new VerbsTransport(config));
  t->vconfig_ = vc;
  int n = 0;
  t->devices_ = rdma_get_devices(&n);
  if (t->devices_ == nullptr || n <= 0) {
    return RDMAFLOW_ERROR(
        Code::kNotViable, op, -1,
        "librdmacm sees no RDMA device (rdma_get_devices: " + std::string(std::strerror(errno)) +
            "); is the rdma_cm kernel module loaded? see docs/soft-roce.md");
  }
  ibv_context* ctx = nullptr;
  std::optional<PortChoice> port;
  std::string reasons;
  for (int i = 0; i < n && !port; ++i) {
    std::string name = ibv_get_device_name(t->devices_[i]->device);
    if (vc.device && name != *vc.device) continue;
    auto choice = choose_port(t->devices_[i], vc);
    if (choice.is_ok()) {
      ctx = t->devices_[i];
      port = std::move(choice).value();
    } else if (vc.device || choice.status().code() == Code::kInvalidArgument) {
      return choice.status();
    } else {
      reasons += (reasons.empty() ? "" : "; ") + choice.status().reason();
    }
  }
  if (!port) return RDMAFLOW_ERROR(Code::kNotViable, op, -1, reasons);
  RDMAFLOW_ASSIGN_OR_RETURN(t->bind_ip_, choose_bind_ip(config, *port));
  std::string summary = port->summary;
  RDMAFLOW_ASSIGN_OR_RETURN(t->core_, VerbsCore::open(ctx, vc, std::move(*port), config.rank));
  RDMAFLOW_RETURN_IF_ERROR(t->start());
  RDMAFLOW_LOG_INFO("verbs: rank {} uses {}; binds {}", config.rank, summary, t->bind_ip_);
  return std::unique_ptr<Transport>(std::move(t));
}

Status VerbsTransport::start() {
  const char* op = "create verbs transport";
  ec_ = rdma_create_event_channel();
  if (ec_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                          std::string("rdma_create_event_channel failed: ") + std::strerror(errno));
  }
  set_nonblocking(ec_->fd);
  set_nonblocking(core_->comp_channel()->fd);
  set_nonblocking(core_->context()->async_fd);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    return RDMAFLOW_ERROR(Code::kInternal, op, -1,
                          std::string("eventfd failed: ") + std::strerror(errno));
  }
  core_->set_progress_thread(std::thread::id(), wake_fd_);  // queue hand-offs from now on
  progress_ = std::thread([this] { progress_loop(); });
  return Status::ok();
}

TransportCapabilities VerbsTransport::capabilities() const {
  TransportCapabilities c;
  if (!core_) return c;
  const PortChoice& port = core_->port();
  c.device = port.summary;
  if (port.ethernet) {
    c.fabric = roce_fabric(port.gid.ipv4);  // "roce 10.0.0.0/24"
  } else {
    static const char* kHex = "0123456789abcdef";
    std::string prefix;
    for (size_t i = 0; i < 8; ++i) {
      prefix.push_back(kHex[port.gid.entry.gid[i] >> 4]);
      prefix.push_back(kHex[port.gid.entry.gid[i] & 15]);
    }
    c.fabric = "ib " + prefix;
  }
  return c;
}

VerbsTransport::~VerbsTransport() {
  shutdown();
}

void VerbsTransport::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_) return;
    shut_ = true;
  }
  cv_.notify_all();
  if (core_) {
    for (auto& ch : core_->channels()) ch->close();
  }
  stop_ = true;
  if (progress_.joinable()) {
    uint64_t one = 1;
    ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
    (void)rc;
    progress_.join();
  }
  if (core_) {
    core_->clear_progress_thread();  // leftover callbacks run here, exactly once
    for (auto& ch : core_->channels()) {
      ch->destroy_resources();
      core_->remove_channel(ch.get());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, p] : pending_) p.channel->destroy_resources();
    pending_.clear();
    accepted_.clear();
    if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
    listen_id_ = nullptr;
  }
  if (core_) core_->close();
  if (ec_ != nullptr) rdma_destroy_event_channel(ec_);
  ec_ = nullptr;
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
  if (devices_ != nullptr) rdma_free_devices(devices_);
  devices_ = nullptr;
}

// ---------------------------------------------------------------- memory

Result<RegionId> VerbsTransport::register_memory(void* addr, size_t len) {
  return core_->register_memory(addr, len);
}
Status VerbsTransport::deregister_memory(RegionId region) {
  return core_->deregister_memory(region);
}
Result<RemoteKey> VerbsTransport::export_key(const void* addr, size_t len) {
  return core_->export_key(addr, len);
}
Status VerbsTransport::revoke_key(const RemoteKey& key) {
  return core_->revoke_key(key);
}

// ---------------------------------------------------------------- connections

Result<std::string> VerbsTransport::listen() {
  const char* op = "listen";
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "the transport was shut down");
  if (!listen_address_.empty()) return listen_address_;
  VerbsAddress addr;
  addr.host = bind_ip_;
  addr.ipv6 = bind_ip_.find(':') != std::string::npos;
  sockaddr_storage ss{};
  RDMAFLOW_ASSIGN_OR_RETURN(socklen_t sslen, to_sockaddr(addr, &ss));
  (void)sslen;
  if (rdma_create_id(ec_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, -1,
                          std::string("rdma_create_id failed: ") + std::strerror(errno));
  }
  auto fail = [&](const std::string& why) {
    rdma_destroy_id(listen_id_);
    listen_id_ = nullptr;
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, -1, why);
  };
  if (rdma_bind_addr(listen_id_, reinterpret_cast<sockaddr*>(&ss)) != 0) {
    return fail("rdma_bind_addr(" + bind_ip_ + ") failed: " + std::strerror(errno) +
                "; is that address on the RDMA netdev (rdma link show)?");
  }
  if (listen_id_->verbs != nullptr && listen_id_->verbs != core_->context()) {
    return fail(bind_ip_ + " belongs to RDMA device '" +
                std::string(ibv_get_device_name(listen_id_->verbs->device)) +
                "', but this transport uses '" + core_->port().device + "'");
  }
  if (rdma_listen(listen_id_, 128) != 0) {
    return fail(std::string("rdma_listen failed: ") + std::strerror(errno));
  }
  addr.port = ntohs(rdma_get_src_port(listen_id_));
  listen_address_ = format_verbs_address(addr);
  RDMAFLOW_LOG_INFO("verbs: rank {} listening at {}", config_.rank, listen_address_);
  return listen_address_;
}

Result<std::shared_ptr<Channel>> VerbsTransport::connect(int peer_rank, const std::string& address,
                                                         Millis timeout) {
  const char* op = "connect";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_)
      return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "the transport was shut down");
  }
  auto parsed = parse_verbs_address(address);
  if (!parsed.is_ok()) return parsed.status().with_op(op);
  sockaddr_storage dst{};
  sockaddr_storage src{};
  RDMAFLOW_ASSIGN_OR_RETURN(socklen_t dlen, to_sockaddr(*parsed, &dst));
  (void)dlen;
  VerbsAddress local{bind_ip_, 0, bind_ip_.find(':') != std::string::npos};
  RDMAFLOW_ASSIGN_OR_RETURN(socklen_t slen, to_sockaddr(local, &src));
  (void)slen;
  if (timeout.count() <= 0) timeout = config_.connect_timeout;
  auto deadline = Clock::now() + timeout;

  rdma_event_channel* ec = rdma_create_event_channel();
  if (ec == nullptr) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                          std::string("rdma_create_event_channel failed: ") + std::strerror(errno));
  }
  set_nonblocking(ec->fd);
  rdma_cm_id* id = nullptr;
  std::shared_ptr<VerbsChannel> ch;
  bool migrated = false;
  auto cleanup = [&] {
    if (ch) {
      core_->remove_channel(ch.get());
      ch->destroy_resources();  // nothing was posted yet; destroys the id too
    } else if (id != nullptr) {
      rdma_destroy_id(id);
    }
    if (!migrated) rdma_destroy_event_channel(ec);
  };
  auto fail = [&](Status st) {
    cleanup();
    return st;
  };
  auto fail_errno = [&](const std::string& call) {
    return fail(RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                               call + " failed: " + std::strerror(errno) + " (" + address + ")"));
  };
  if (rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return fail_errno("rdma_create_id");

  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        std::max(1, remaining_ms(deadline))) != 0) {
    return fail_errno("rdma_resolve_addr");
  }
  {
    auto ev = wait_cm_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, peer_rank, address);
    if (!ev.is_ok()) return fail(ev.status());
    rdma_ack_cm_event(*ev);
  }
  if (rdma_resolve_route(id, std::max(1, remaining_ms(deadline))) != 0) {
    return fail_errno("rdma_resolve_route");
  }
  {
    auto ev = wait_cm_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, peer_rank, address);
    if (!ev.is_ok()) return fail(ev.status());
    rdma_ack_cm_event(*ev);
  }
  set_ack_timeout(id);
  auto created = VerbsChannel::create(core_, id);
  if (!created.is_ok()) return fail(created.status().with_op(op));
  ch = std::move(created).value();
  core_->add_channel(ch);

  // The job handshake (verbs_wire.h): our hello in the connect request, the
  // listener's proof and Hello in its accept, our proof as the first SEND.
  auto secret = load_job_secret();
  if (!secret.is_ok()) return fail(secret.status().with_op(op));
  auth::Connector connector(std::move(secret).value(), kAuthLabel);
  auto auth_hello = connector.hello();
  if (!auth_hello.is_ok()) return fail(auth_hello.status().with_op(op));
  rdma_conn_param param{};
  param.private_data = auth_hello->data();
  param.private_data_len = static_cast<uint8_t>(auth_hello->size());
  param.responder_resources = static_cast<uint8_t>(std::min<uint32_t>(core_->max_rd_atomic(), 255));
  param.initiator_depth = param.responder_resources;
  param.retry_count = kRetryCount;
  param.rnr_retry_count = 7;  // infinite; credits keep receive buffers posted anyway
  if (rdma_connect(id, &param) != 0) return fail_errno("rdma_connect");

  Hello peer;
  auth::Proof proof{};
  {
    auto ev = wait_cm_event(ec, RDMA_CM_EVENT_ESTABLISHED, deadline, peer_rank, address);
    if (!ev.is_ok()) return fail(ev.status());
    std::span<const uint8_t> pdata(static_cast<const uint8_t*>((*ev)->param.conn.private_data),
                                   (*ev)->param.conn.private_data_len);
    Status bad;
    if (pdata.size() < auth::kChallengeBytes) {
      bad = RDMAFLOW_ERROR(Code::kUnauthenticated, op, peer_rank,
                           address +
                               " did not answer with the job handshake (not an rdmaflow "
                               "verbs listener, or an older one)");
    } else if (auto p = connector.answer(pdata.first(auth::kChallengeBytes),
                                         "rank " + std::to_string(peer_rank) + " at " + address);
               !p.is_ok()) {
      bad = Status(p.status().code(), op, peer_rank, p.status().reason());
    } else if (auto decoded = Hello::decode(pdata.subspan(auth::kChallengeBytes));
               !decoded.is_ok()) {
      bad = decoded.status().with_op(op);
    } else {
      proof = *p;
      peer = *decoded;
    }
    rdma_ack_cm_event(*ev);
    if (!bad.is_ok()) {
      rdma_disconnect(id);
      return fail(bad);
    }
  }
  if (peer.rank != peer_rank) {
    rdma_disconnect(id);
    return fail(RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                               address + " is rank " + std::to_string(peer.rank) + ", not rank " +
                                   std::to_string(peer_rank)));
  }
  if (Status st = ch->set_peer(peer); !st.is_ok()) {
    rdma_disconnect(id);
    return fail(st);
  }
  // From now on DISCONNECTED and friends reach the progress thread.
  if (rdma_migrate_id(id, ec_) != 0) {
    rdma_disconnect(id);
    return fail_errno("rdma_migrate_id");
  }
  migrated = true;
  rdma_destroy_event_channel(ec);
  ch->on_established();    // the active side saw ESTABLISHED above
  ch->queue_proof(proof);  // the first message the listener reads
  ch->mark_connected();
  log_path(ch, peer_rank);
  return std::shared_ptr<Channel>(ch);
}

Result<std::shared_ptr<Channel>> VerbsTransport::accept(int peer_rank, Millis timeout) {
  RDMAFLOW_ASSIGN_OR_RETURN(std::string where, listen());
  std::unique_lock<std::mutex> lock(mu_);
  bool ready = cv_.wait_for(lock, timeout, [&] {
    auto it = accepted_.find(peer_rank);
    return shut_ || (it != accepted_.end() && !it->second.empty());
  });
  if (shut_) {
    return RDMAFLOW_ERROR(Code::kCancelled, "accept", peer_rank, "the transport was shut down");
  }
  if (!ready) {
    return RDMAFLOW_ERROR(Code::kTimeout, "accept", peer_rank,
                          "rank " + std::to_string(peer_rank) + " did not connect to " + where +
                              " within " + std::to_string(timeout.count()) + " ms");
  }
  auto& q = accepted_[peer_rank];
  auto ch = q.front();
  q.pop_front();
  return std::shared_ptr<Channel>(ch);
}

void VerbsTransport::log_path(const std::shared_ptr<VerbsChannel>& ch, int peer) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ch->cm_id() == nullptr || ch->cm_id()->qp == nullptr ||
      ibv_query_qp(ch->cm_id()->qp, &attr, IBV_QP_AV | IBV_QP_PATH_MTU, &init) != 0) {
    return;
  }
  const auto& port = core_->port();
  uint32_t sgid = attr.ah_attr.grh.sgid_index;
  if (port.ethernet && sgid != port.gid.entry.index) {
    RDMAFLOW_LOG_WARN(
        "verbs: rdma_cm uses GID index {} for rank {}, the configured/auto choice was {} ({}); "
        "rdma_cm follows the bound IP and the kernel's default RoCE mode "
        "(/sys/kernel/config/rdma_cm/<dev>/ports/<port>/default_roce_mode)",
        sgid, peer, port.gid.entry.index, port.gid.reason);
  } else {
    RDMAFLOW_LOG_DEBUG("verbs: connected to rank {} over GID index {}, path mtu {}", peer, sgid,
                       128 << attr.path_mtu);
  }
}

}  // namespace rdmaflow::verbs

namespace rdmaflow {
namespace {
// RDMA when both devices are on one fabric.
Reach verbs_reaches(const Endpoint& a, const Endpoint& b, bool /*same_host*/) {
  const std::string& fa = a.caps->fabric;
  const std::string& fb = b.caps->fabric;
  if (!verbs::fabrics_reach(fa, fb)) {
    return {Medium::kNone, "verbs devices on different fabrics ('" + fa + "' and '" + fb + "')"};
  }
  // The more specific of the two names (they differ only when one RoCE subnet
  // is unknown), so the reason reads the same from both ends.
  const std::string& fabric = fa.size() >= fb.size() ? fa : fb;
  return {Medium::kRdma, "RDMA devices on one fabric (" + fabric + "): " + rank_text(a.rank) + " " +
                             a.caps->device + "; " + rank_text(b.rank) + " " + b.caps->device};
}
}  // namespace

void register_verbs_transport() {
  register_transport_backend(
      {"verbs", 30,
       [](const TransportConfig& config) { return verbs::VerbsTransport::create(config); },
       verbs_reaches});
}
}  // namespace rdmaflow
