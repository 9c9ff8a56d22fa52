#include "transport/ucx/ucx_core.h"

#include <net/if.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/env.h"
#include "common/handshake.h"
#include "common/job_secret.h"
#include "common/log.h"
#include "transport/shm/notify_ring.h"
#include "transport/ucx/ucx_channel.h"

// UcxCore is defined across three files: this one (options, setup and teardown,
// connections), ucx_progress.cc (ops, submission, progress, dispatch, peer
// watching) and ucx_grants.cc (registered regions, grants, revocation).

namespace rdmaflow::ucx {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Status bad_knob(const char* name, const std::string& value, const char* expected) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "create ucx transport", -1,
                        std::string(name) + "='" + value + "' is not " + expected);
}

}  // namespace

const char* Op::name() const {
  switch (kind) {
    case OpKind::kWrite:
      return "write";
    case OpKind::kRead:
      return "read";
    case OpKind::kMessage:
      return "send message";
    case OpKind::kRevokeAck:
      return "confirm revocation";
    case OpKind::kCtrl:
      break;
  }
  return "control message";
}

Result<Options> load_options() {
  Options o;
  if (auto v = env_string("RDMAFLOW_UCX_DATA_PATH")) {
    const std::string s = lower(*v);
    if (s == "auto") {
      o.data_path = Options::DataPath::kAuto;
    } else if (s == "rma" || s == "put") {
      o.data_path = Options::DataPath::kRma;
    } else if (s == "am") {
      o.data_path = Options::DataPath::kAm;
    } else {
      return bad_knob("RDMAFLOW_UCX_DATA_PATH", *v, "auto, rma or am");
    }
  }
  if (auto v = env_string("RDMAFLOW_UCX_ERR_MODE")) {
    const std::string s = lower(*v);
    if (s == "auto") {
      o.err_mode = Options::ErrMode::kAuto;
    } else if (s == "peer") {
      o.err_mode = Options::ErrMode::kPeer;
    } else if (s == "none") {
      o.err_mode = Options::ErrMode::kNone;
    } else {
      return bad_knob("RDMAFLOW_UCX_ERR_MODE", *v, "auto, peer or none");
    }
  }
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t eager, env_int("RDMAFLOW_UCX_EAGER_MAX", 8192));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t busy, env_int("RDMAFLOW_UCX_BUSY_POLL", 0));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t wait_block, env_int("RDMAFLOW_UCX_WAIT_BLOCK", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t spin_yield, env_int("RDMAFLOW_UCX_SPIN_YIELD", 16));
  if (spin_yield < 0) {
    return bad_knob("RDMAFLOW_UCX_SPIN_YIELD", std::to_string(spin_yield), ">= 0");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t hold_acks, env_int("RDMAFLOW_UCX_HOLD_ACKS", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t direct, env_int("RDMAFLOW_UCX_DIRECT", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t ring, env_int("RDMAFLOW_UCX_NOTIFY_RING", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t ring_slots, env_int("RDMAFLOW_UCX_NOTIFY_RING_SLOTS", 1024));
  if (ring_slots < 1 || ring_slots > shm::NotifyRing::kMaxSlots) {
    return bad_knob("RDMAFLOW_UCX_NOTIFY_RING_SLOTS", std::to_string(ring_slots),
                    "between 1 and 1048576");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t max_queued, env_int("RDMAFLOW_MAX_PEER_QUEUED",
                                                        static_cast<int64_t>(o.max_peer_queued)));
  if (max_queued < 1) {
    return bad_knob("RDMAFLOW_MAX_PEER_QUEUED", std::to_string(max_queued), ">= 1");
  }
  o.max_peer_queued = static_cast<uint64_t>(max_queued);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t max_message, env_int("RDMAFLOW_MAX_MESSAGE_BYTES",
                                                         static_cast<int64_t>(o.max_message)));
  if (max_message < 1) {
    return bad_knob("RDMAFLOW_MAX_MESSAGE_BYTES", std::to_string(max_message), ">= 1");
  }
  o.max_message = static_cast<uint64_t>(max_message);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t wait_spin, env_int("RDMAFLOW_UCX_WAIT_SPIN_US", 50));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t progress_spin, env_int("RDMAFLOW_UCX_PROGRESS_SPIN_US", 20));
  if (eager < 0) return bad_knob("RDMAFLOW_UCX_EAGER_MAX", std::to_string(eager), ">= 0");
  if (wait_spin < 0)
    return bad_knob("RDMAFLOW_UCX_WAIT_SPIN_US", std::to_string(wait_spin), ">= 0");
  if (progress_spin < 0) {
    return bad_knob("RDMAFLOW_UCX_PROGRESS_SPIN_US", std::to_string(progress_spin), ">= 0");
  }
  o.eager_max = static_cast<uint64_t>(eager);
  o.busy_poll = busy != 0;
  o.wait_block = wait_block != 0;
  o.spin_yield = static_cast<uint32_t>(spin_yield);
  o.hold_acks = hold_acks != 0;
  o.direct = direct != 0;
  o.notify_ring = ring != 0;
  o.ring_slots = static_cast<uint32_t>(ring_slots);
  o.wait_spin = std::chrono::microseconds(wait_spin);
  o.progress_spin = std::chrono::microseconds(progress_spin);
  return o;
}

// ---------------------------------------------------------------------------
// Setup and teardown

UcxCore::UcxCore(const TransportConfig& config, Options options)
    : rank_(config.rank), options_(options), ifname_(config.ifname) {}

Result<std::shared_ptr<UcxCore>> UcxCore::create(const TransportConfig& config) {
  RDMAFLOW_ASSIGN_OR_RETURN(Options options, load_options());
  std::shared_ptr<UcxCore> core(new UcxCore(config, options));
  if (Status st = core->init(config); !st.is_ok()) {
    core->shutdown();
    return st;
  }
  core->thread_ = std::thread([c = core.get()] { c->progress_thread(); });
  return core;
}

Status UcxCore::init(const TransportConfig& config) {
  auto not_viable = [](const std::string& what, ucs_status_t s) {
    return RDMAFLOW_ERROR(Code::kNotViable, "create ucx transport", -1,
                          what + " failed: " + ucs_status_string(s));
  };
  // Read the UCX_* variables of this process now (UCX_TLS may be set per process).
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK) return not_viable("ucp_config_read", s);
  if (!config.ifname.empty() && !env_string("UCX_NET_DEVICES") &&
      ::if_nametoindex(config.ifname.c_str()) != 0) {
    if (ucp_config_modify(cfg, "NET_DEVICES", config.ifname.c_str()) != UCS_OK) {
      RDMAFLOW_LOG_WARN("ucx: cannot restrict UCX to interface {}", config.ifname);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  s = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  if (s != UCS_OK) {
    context_ = nullptr;
    return not_viable("ucp_init", s);
  }

  if (options_.direct) {
    // Direct channels exist only where UCX itself runs on shared memory; without a
    // posix/sysv resource (UCX_TLS=tcp,self, say) registration leaves memory alone.
    char* buf = nullptr;
    size_t size = 0;
    if (FILE* f = ::open_memstream(&buf, &size)) {
      ucp_context_print_info(context_, f);
      std::fclose(f);
      const std::string info(buf, size);
      std::free(buf);
      shm_capable_ =
          info.find("posix/") != std::string::npos || info.find("sysv/") != std::string::npos;
    }
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    return not_viable("ucp_worker_create", s);
  }

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (s != UCS_OK) return not_viable("ucp_worker_get_address", s);
  address_ = encode_address(shm::self_identity(),
                            std::span<const uint8_t>(reinterpret_cast<uint8_t*>(addr), addr_len));
  ucp_worker_release_address(worker_, addr);

  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kAmId;
  hp.cb = &UcxCore::on_am;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  s = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (s != UCS_OK) return not_viable("ucp_worker_set_am_recv_handler", s);

  s = ucp_worker_get_efd(worker_, &worker_fd_);
  if (s != UCS_OK) return not_viable("ucp_worker_get_efd", s);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  control_ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  sleep_ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  waiter_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  waiter_ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  ring_wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || control_ep_ < 0 || sleep_ep_ < 0 || waiter_fd_ < 0 || waiter_ep_ < 0 ||
      ring_wake_fd_ < 0) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "create ucx transport", -1,
                          std::string("eventfd/epoll: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(control_ep_, EPOLL_CTL_ADD, wake_fd_, &ev);
  ev.data.u64 = kWorkerTag;
  ::epoll_ctl(sleep_ep_, EPOLL_CTL_ADD, worker_fd_, &ev);
  ev.data.u64 = kControlTag;
  ::epoll_ctl(sleep_ep_, EPOLL_CTL_ADD, control_ep_, &ev);
  ev.data.u64 = kWorkerTag;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, worker_fd_, &ev);
  ev.data.u64 = kControlTag;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, control_ep_, &ev);
  ev.data.u64 = kWaiterTag;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, waiter_fd_, &ev);
  // Peers writing into our notify rings wake whichever thread sleeps here.
  ev.data.u64 = kRingWakeTag;
  ::epoll_ctl(sleep_ep_, EPOLL_CTL_ADD, ring_wake_fd_, &ev);
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, ring_wake_fd_, &ev);

  events_.reserve(64);
  ready_.reserve(64);
  dispatching_.reserve(64);
  return Status::ok();
}

UcxCore::~UcxCore() {
  shutdown();
  for (int fd : {wake_fd_, control_ep_, sleep_ep_, waiter_fd_, waiter_ep_, ring_wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void UcxCore::shutdown() {
  if (stop_thread_.exchange(true)) return;
  // 1. Stop the progress thread; from here on this thread (and busy waiters) drive.
  if (thread_.joinable()) {
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = ::write(wake_fd_, &one, sizeof(one));
      (void)n;
    }
    thread_.join();
  }
  // 2. Close every channel (pending operations fail with kCancelled), let the
  //    closes finish for a short while, and run the resulting callbacks here.
  {
    std::unique_lock<std::mutex> lock(worker_mu_);
    if (worker_ != nullptr) {
      for (auto& ch : channels_) {
        ch->close_locked(
            RDMAFLOW_ERROR(Code::kCancelled, "channel", ch->peer_rank(), "transport shut down"));
      }
      wait_closing_locked(lock, Clock::now() + std::chrono::seconds(2));
    }
    stopped_.store(true, std::memory_order_release);
  }
  dispatch();
  { std::lock_guard<std::mutex> l(ctl_mu_); }
  ctl_cv_.notify_all();
  // 3. Release UCX resources.
  std::lock_guard<std::mutex> lock(worker_mu_);
  for (auto& c : closing_) {
    for (ucp_rkey_h k : c.rkeys) ucp_rkey_destroy(k);
    if (c.request != nullptr) ucp_request_free(c.request);
  }
  closing_.clear();
  for (auto& [id, r] : regions_) {
    (void)grants_.remove_region(id);  // and its grants
    if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
    // The pages stay a shared mapping of the (now unnamed) memfd: still valid memory
    // for their owner, and copying them back would cost page faults at every exit.
    if (r.shm.fd >= 0) ::close(r.shm.fd);
  }
  regions_.clear();
  queried_by_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  for (auto& ch : channels_) {
    if (ch->pidfd_ >= 0) {
      ::close(ch->pidfd_);
      ch->pidfd_ = -1;
    }
  }
  // Breaks the channel <-> core reference cycle; users may still hold channels,
  // whose operations now fail with kCancelled.
  ring_channels_.clear();
  held_acks_.clear();
  held_count_.store(0, std::memory_order_relaxed);
  channels_.clear();
  std::lock_guard<std::mutex> l(ctl_mu_);
  accepted_.clear();
}

void UcxCore::wait_closing_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  (void)lock;
  int64_t inflight = 0;
  do {
    pass_locked();
    // ucp_worker_destroy must not meet an endpoint with operations still queued (UCX
    // asserts), so let the transfers of live peers drain; a dead peer's never will.
    inflight = 0;
    for (auto& ch : channels_) {
      if (!ch->peer_gone) inflight += ch->requests_inflight();
    }
  } while ((!closing_.empty() || !to_close_.empty() || inflight > 0) && Clock::now() < deadline);
  if (inflight > 0) {
    RDMAFLOW_LOG_WARN("ucx: shutting down with {} UCX requests still in flight", inflight);
  }
}

// ---------------------------------------------------------------------------
// Active messages and endpoint errors

ucs_status_t UcxCore::on_am(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param) {
  auto* core = static_cast<UcxCore*>(arg);
  if (header_length != sizeof(AmHeader)) {
    RDMAFLOW_LOG_WARN("ucx: dropping an active message with a {}-byte header", header_length);
    return UCS_OK;
  }
  AmHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.type == static_cast<uint8_t>(MsgType::kHello)) {
    if (core->hellos_.size() >= core->max_hellos_) {
      RDMAFLOW_LOG_WARN(
          "ucx: dropped a hello from a peer claiming rank {}: {} hellos are already queued "
          "(RDMAFLOW_AUTH_PENDING_MAX)",
          h.value, core->hellos_.size());
      return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && length < 4096 &&
        length > auth::kHelloBytes) {
      const auto* bytes = static_cast<const uint8_t*>(data);
      const size_t address_len = length - auth::kHelloBytes;
      core->hellos_.push_back(Hello{static_cast<int>(h.value), static_cast<uint32_t>(h.id),
                                    std::string(reinterpret_cast<const char*>(bytes), address_len),
                                    std::vector<uint8_t>(bytes + address_len, bytes + length)});
    }
    return UCS_OK;
  }
  if (h.channel == 0 || h.channel > core->channels_.size()) {
    RDMAFLOW_LOG_DEBUG("ucx: dropping a message for unknown channel {}", h.channel);
    return UCS_OK;
  }
  UcxChannel* ch = core->channels_[h.channel - 1].get();
  if (ch->failed()) return UCS_OK;
  return ch->on_am(h, data, length, param);
}

void UcxCore::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ch = static_cast<UcxChannel*>(arg);
  ch->peer_gone = true;
  if (ch->failed()) return;
  ch->fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", ch->peer_rank(),
                          std::string("UCX endpoint failed: ") + ucs_status_string(status) +
                              " (the peer exited or the connection broke)"));
}

// ---------------------------------------------------------------------------
// Connection setup

Options::DataPath UcxCore::choose_data_path(ucp_ep_h ep, std::string* lanes) const {
  // UCX 1.13 has no query for an endpoint's transports; read its description.
  // Lanes look like "lane[0]:  1:sysv/memory.0 md[1] -> ...".
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&buf, &size);
  if (f == nullptr) return Options::DataPath::kRma;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string info(buf, size);
  std::free(buf);
  // Transports on which UCX 1.13 emulates put/get on user memory in software.
  static const char* kNoRma[] = {"posix", "sysv", "cma", "knem", "self"};
  bool any_lane = false;
  bool rma = false;
  size_t pos = 0;
  while ((pos = info.find("lane[", pos)) != std::string::npos) {
    size_t colon = info.find(':', pos);
    if (colon == std::string::npos) break;
    size_t start = info.find(':', colon + 1);  // "  1:sysv/..." -> after the resource index
    size_t slash = info.find('/', colon + 1);
    size_t eol = info.find('\n', pos);
    pos = colon + 1;
    if (start == std::string::npos || slash == std::string::npos || slash < start ||
        (eol != std::string::npos && slash > eol)) {
      continue;
    }
    const std::string tl = info.substr(start + 1, slash - start - 1);
    if (lanes->find(tl) == std::string::npos) *lanes += (lanes->empty() ? "" : ",") + tl;
    any_lane = true;
    if (std::none_of(std::begin(kNoRma), std::end(kNoRma),
                     [&](const char* n) { return tl == n; })) {
      rma = true;
    }
  }
  if (options_.data_path != Options::DataPath::kAuto) return options_.data_path;
  return rma || !any_lane ? Options::DataPath::kRma : Options::DataPath::kAm;
}

Result<std::shared_ptr<UcxChannel>> UcxCore::make_channel_locked(int peer_rank,
                                                                 const PeerAddress& peer,
                                                                 const char* op) {
  const bool local = shm::same_host(shm::self_identity(), peer.identity);
  int pidfd = -1;
  if (local) {
    RDMAFLOW_ASSIGN_OR_RETURN(pidfd, shm::open_peer_pidfd(peer.identity, peer_rank, op));
  }
  bool peer_mode = !local;
  if (options_.err_mode == Options::ErrMode::kPeer) peer_mode = true;
  if (options_.err_mode == Options::ErrMode::kNone) peer_mode = false;

  const uint32_t id = static_cast<uint32_t>(channels_.size() + 1);
  auto ch = std::make_shared<UcxChannel>(shared_from_this(), id, peer_rank, peer.identity);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer.worker.data());
  ep.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = &UcxCore::on_ep_error;
  ep.err_handler.arg = ch.get();
  ucp_ep_h handle = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
  if (s != UCS_OK) {
    if (pidfd >= 0) ::close(pidfd);
    const char* tls = std::getenv("UCX_TLS");
    return RDMAFLOW_ERROR(
        Code::kConnectionFailed, op, peer_rank,
        std::string("ucp_ep_create failed: ") + ucs_status_string(s) + " (UCX_TLS=" +
            (tls ? tls : "<unset>") + ", error mode " + (peer_mode ? "peer" : "none") +
            (peer_mode && local ? "; UCX 1.13 shared memory has no peer-failure support, "
                                  "use RDMAFLOW_UCX_ERR_MODE=auto"
                                : "") +
            ")");
  }
  std::string lanes;
  const bool put_path = choose_data_path(handle, &lanes) == Options::DataPath::kRma;
  ch->attach(handle, put_path, pidfd);
  channels_.push_back(ch);
  if (pidfd >= 0) watch_pidfd(pidfd, id);
  RDMAFLOW_LOG_DEBUG("ucx: channel {} to rank {}: {} path, error mode {}, transports {}", id,
                     peer_rank, put_path ? "rma" : "am", peer_mode ? "peer" : "none", lanes);
  return ch;
}

void UcxCore::handle_hellos_locked() {
  std::vector<Hello> hellos;
  hellos.swap(hellos_);
  if (hellos.empty()) return;
  // Channels still waiting for their connector's proof: dropped once stale, and
  // never more than the cap, so hellos that never prove anything hold little.
  const auto now = Clock::now();
  size_t pending = 0;
  for (auto& ch : channels_) {
    if (!ch->awaiting_proof() || ch->failed()) continue;
    if (now - ch->auth_since() > auth::handshake_timeout()) {
      ch->refuse("no proof of the job secret within RDMAFLOW_AUTH_TIMEOUT_MS");
    } else {
      ++pending;
    }
  }
  for (Hello& h : hellos) {
    const std::string who = "a UCX peer claiming rank " + std::to_string(h.rank);
    if (pending >= static_cast<size_t>(auth::max_pending_handshakes())) {
      RDMAFLOW_LOG_WARN(
          "ucx: refused {}: {} connections are already in the handshake "
          "(RDMAFLOW_AUTH_PENDING_MAX)",
          who, pending);
      continue;
    }
    auto secret = load_job_secret();
    if (!secret.is_ok()) {
      RDMAFLOW_LOG_WARN("ucx: refused {}: {}", who, secret.status().to_string());
      continue;
    }
    auto acceptor = std::make_unique<auth::Acceptor>(std::move(*secret), "ucx");
    auto challenge = acceptor->challenge(h.auth_hello, who);
    if (!challenge.is_ok()) {  // garbage: no endpoint is made for it
      RDMAFLOW_LOG_WARN("ucx: {}", challenge.status().reason());
      continue;
    }
    auto peer = decode_address(h.address);
    if (!peer.is_ok()) {
      RDMAFLOW_LOG_WARN("ucx: ignoring a hello from rank {}: {}", h.rank,
                        peer.status().to_string());
      continue;
    }
    auto made = make_channel_locked(h.rank, *peer, "accept");
    if (!made.is_ok()) {
      RDMAFLOW_LOG_WARN("ucx: cannot answer the hello of rank {}: {}", h.rank,
                        made.status().to_string());
      continue;
    }
    std::shared_ptr<UcxChannel> ch = std::move(made).value();
    ch->set_remote_id(h.remote_channel);
    ch->expect_proof(std::move(acceptor), who);
    ch->send_ctrl(MsgType::kHelloAck, ch->id(),
                  std::vector<uint8_t>(challenge->begin(), challenge->end()));
    ++pending;
  }
}

void UcxCore::authenticated_locked(UcxChannel* ch) {
  std::shared_ptr<UcxChannel> shared = channels_[ch->id() - 1];
  {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    accepted_[ch->peer_rank()].push_back(std::move(shared));
  }
  ctl_cv_.notify_all();
}

Result<std::shared_ptr<Channel>> UcxCore::connect(int peer_rank, const std::string& address,
                                                  Millis timeout) {
  const char* op = "connect";
  if (stop_thread_.load()) {
    return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
  }
  auto peer = decode_address(address);
  if (!peer.is_ok()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_rank, peer.status().reason());
  }
  RDMAFLOW_ASSIGN_OR_RETURN(JobSecret secret, load_job_secret());
  auto connector = std::make_unique<auth::Connector>(std::move(secret), "ucx");
  RDMAFLOW_ASSIGN_OR_RETURN(auth::Hello auth_hello, connector->hello());
  std::vector<uint8_t> hello(address_.begin(), address_.end());
  hello.insert(hello.end(), auth_hello.begin(), auth_hello.end());
  std::shared_ptr<UcxChannel> ch;
  {
    std::unique_lock<std::mutex> lock(worker_mu_);
    if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
    RDMAFLOW_ASSIGN_OR_RETURN(ch, make_channel_locked(peer_rank, *peer, op));
    ch->answer_challenge_with(std::move(connector));
    ch->send_ctrl(MsgType::kHello, ch->id(), std::move(hello), 0, static_cast<uint64_t>(rank_));
    pass_locked();
  }
  dispatch();
  const auto deadline = Clock::now() + timeout;
  wait_control([&] { return ch->state() != UcxChannel::State::kConnecting; }, deadline);
  if (ch->state() == UcxChannel::State::kOpen) return std::shared_ptr<Channel>(ch);
  Status err;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (ch->state() == UcxChannel::State::kConnecting && !stopped()) {
      ch->fail(RDMAFLOW_ERROR(Code::kTimeout, op, peer_rank,
                              "no answer within " + std::to_string(timeout.count()) +
                                  " ms from the UCX worker at that address (is the peer "
                                  "running and listening?)"));
      pass_locked();
    }
  }
  dispatch();
  err = ch->error();
  if (err.is_ok()) err = RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
  if (err.code() == Code::kPeerFailed) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank, err.reason());
  }
  return err.with_op(op);
}

Result<std::shared_ptr<Channel>> UcxCore::accept(int peer_rank, Millis timeout) {
  const char* op = "accept";
  const auto deadline = Clock::now() + timeout;
  wait_control(
      [&] {
        auto it = accepted_.find(peer_rank);
        return it != accepted_.end() && !it->second.empty();
      },
      deadline);
  std::lock_guard<std::mutex> lock(ctl_mu_);
  auto it = accepted_.find(peer_rank);
  if (it != accepted_.end() && !it->second.empty()) {
    std::shared_ptr<Channel> ch = it->second.front();
    it->second.pop_front();
    return ch;
  }
  if (stopped() || stop_thread_.load()) {
    return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
  }
  return RDMAFLOW_ERROR(Code::kTimeout, op, peer_rank,
                        "no connection from peer rank " + std::to_string(peer_rank) + " within " +
                            std::to_string(timeout.count()) + " ms");
}

}  // namespace rdmaflow::ucx
