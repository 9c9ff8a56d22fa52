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
#include <random>

#include "common/env.h"
#include "common/log.h"
#include "transport/shm/notify_ring.h"
#include "transport/shm/shared_pages.h"
#include "transport/ucx/ucx_channel.h"

namespace rdmaflow::ucx {

namespace {

// True while this thread runs user callbacks / inbox deliveries (dispatch).
thread_local bool t_dispatching = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr auto kScanPeriod = std::chrono::milliseconds(1);
constexpr int kMaxSleepMs = 100;
constexpr uint64_t kWakeTag = 0;

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
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t direct, env_int("RDMAFLOW_UCX_DIRECT", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t ring, env_int("RDMAFLOW_UCX_NOTIFY_RING", 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t ring_slots, env_int("RDMAFLOW_UCX_NOTIFY_RING_SLOTS", 1024));
  if (ring_slots < 1 || ring_slots > shm::NotifyRing::kMaxSlots) {
    return bad_knob("RDMAFLOW_UCX_NOTIFY_RING_SLOTS", std::to_string(ring_slots),
                    "between 1 and 1048576");
  }
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
  address_ = encode_address(self_identity(),
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
  if (wake_fd_ < 0 || control_ep_ < 0 || sleep_ep_ < 0 || waiter_fd_ < 0 || waiter_ep_ < 0) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "create ucx transport", -1,
                          std::string("eventfd/epoll: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(control_ep_, EPOLL_CTL_ADD, wake_fd_, &ev);
  ev.data.u64 = 1;
  ::epoll_ctl(sleep_ep_, EPOLL_CTL_ADD, worker_fd_, &ev);
  ev.data.u64 = 2;
  ::epoll_ctl(sleep_ep_, EPOLL_CTL_ADD, control_ep_, &ev);
  ev.data.u64 = 1;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, worker_fd_, &ev);
  ev.data.u64 = 2;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, control_ep_, &ev);
  ev.data.u64 = 3;
  ::epoll_ctl(waiter_ep_, EPOLL_CTL_ADD, waiter_fd_, &ev);

  std::random_device rd;
  rng_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  events_.reserve(64);
  ready_.reserve(64);
  dispatching_.reserve(64);
  return Status::ok();
}

UcxCore::~UcxCore() {
  shutdown();
  for (int fd : {wake_fd_, control_ep_, sleep_ep_, waiter_fd_, waiter_ep_}) {
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
    if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
    // The pages stay a shared mapping of the (now unnamed) memfd: still valid memory
    // for their owner, and copying them back would cost page faults at every exit.
    if (r.shm.fd >= 0) ::close(r.shm.fd);
  }
  regions_.clear();
  region_by_addr_.clear();
  grants_.clear();
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
// Ops

Op* UcxCore::new_op(OpKind kind, UcxChannel* ch, Callback done, Millis timeout) {
  Op* op = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_free_.empty()) {
      op = pool_free_.back();
      pool_free_.pop_back();
    } else {
      pool_all_.push_back(std::make_unique<Op>());
      op = pool_all_.back().get();
    }
  }
  op->kind = kind;
  op->ch = ch;
  op->done = std::move(done);
  op->refs = 1;  // the user's callback
  op->user_done = false;
  op->deadline = Clock::now() + timeout;
  op->timeout_ms = timeout.count();
  op->id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
  return op;
}

Op* UcxCore::ctrl_op(UcxChannel* ch) {
  Op* op = new_op(OpKind::kCtrl, ch, nullptr, Millis(0));
  op->user_done = true;
  op->refs = 0;
  return op;
}

void UcxCore::release(Op* op) {
  if (--op->refs > 0) return;
  op->put_path = op->notify_stage = op->has_notify = op->in_active = false;
  op->parts = 0;
  op->ch = nullptr;
  op->done = nullptr;
  op->preset = Status();
  op->src = nullptr;
  op->dst = nullptr;
  op->len = op->offset = op->notify = op->seq = 0;
  op->key_id = op->key_secret = op->key_addr = op->key_length = 0;
  op->blob.clear();
  op->bytes.clear();
  op->hdr = AmHeader{};
  op->qnext = op->prev = op->next = nullptr;
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_free_.push_back(op);
}

void UcxCore::unlink_active(Op* op) {
  if (!op->in_active) return;
  op->in_active = false;
  (op->prev ? op->prev->next : active_head_) = op->next;
  (op->next ? op->next->prev : active_tail_) = op->prev;
  op->prev = op->next = nullptr;
}

void UcxCore::complete(Op* op, Status st) {
  if (op->user_done) return;
  op->user_done = true;
  unlink_active(op);
  if (op->done) {
    Event e;
    e.kind = Event::kCallback;
    e.cb = std::move(op->done);
    e.status = std::move(st);
    events_.push_back(std::move(e));
  }
  release(op);
}

void UcxCore::part_done(Op* op, const Status& st) {
  if (!st.is_ok()) {
    complete(op, st);
    return;
  }
  if (--op->parts <= 0) complete(op, Status::ok());
}

void UcxCore::complete_channel_ops(UcxChannel* ch, const Status& st) {
  for (Op* op = active_head_; op != nullptr;) {
    Op* next = op->next;
    if (op->ch == ch) complete(op, st.with_op(op->name()));
    op = next;
  }
}

void UcxCore::emit_notify(Inbox& inbox, uint64_t value) {
  Event e;
  e.kind = Event::kNotify;
  e.inbox = &inbox;
  e.value = value;
  events_.push_back(std::move(e));
}

void UcxCore::emit_message(Inbox& inbox, std::vector<uint8_t> bytes) {
  Event e;
  e.kind = Event::kMessage;
  e.inbox = &inbox;
  e.bytes = std::move(bytes);
  events_.push_back(std::move(e));
}

void UcxCore::emit_inbox_failure(Inbox& inbox, Status st) {
  Event e;
  e.kind = Event::kFail;
  e.inbox = &inbox;
  e.status = std::move(st);
  events_.push_back(std::move(e));
}

void UcxCore::mark_dirty(UcxChannel* ch) {
  if (ch->dirty) return;
  ch->dirty = true;
  dirty_.push_back(ch);
}

void UcxCore::scan_timeouts_locked(Clock::time_point now) {
  next_scan_ = now + kScanPeriod;
  Op* op = active_head_;
  while (op != nullptr) {
    Op* next = op->next;
    if (op->deadline <= now) {
      const int peer = op->ch ? op->ch->peer_rank() : -1;
      complete(op,
               RDMAFLOW_ERROR(Code::kTimeout, op->name(), peer,
                              "no completion within " + std::to_string(op->timeout_ms) + " ms"));
    }
    op = next;
  }
}

// ---------------------------------------------------------------------------
// Submission, progress, dispatch

void UcxCore::submit(Op* op) {
  if (stopped()) {
    // No progress context any more: report on this thread.
    Callback cb = std::move(op->done);
    Status st = op->preset.is_ok()
                    ? RDMAFLOW_ERROR(Code::kCancelled, op->name(),
                                     op->ch ? op->ch->peer_rank() : -1, "transport shut down")
                    : op->preset;
    op->user_done = true;
    release(op);
    if (cb) cb(st);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    subs_.push_back(op);
    subs_count_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Post right away when nobody else is in progress context (no thread hop).
  bool needs_progress = false;
  bool posted = false;
  while (worker_mu_.try_lock()) {
    posted = true;
    if (!stopped()) {
      request_posted_ = false;
      drain_submissions_locked();
      while (!dirty_.empty()) {
        std::vector<UcxChannel*> dirty;
        dirty.swap(dirty_);
        for (UcxChannel* ch : dirty) {
          ch->dirty = false;
          ch->pump();
          ch->flush_acks();
        }
      }
      if (!events_.empty()) {
        needs_progress = true;
        std::lock_guard<std::mutex> lock(ready_mu_);
        for (auto& e : events_) ready_.push_back(std::move(e));
        ready_count_.store(ready_.size(), std::memory_order_release);
        events_.clear();
      }
      needs_progress |= request_posted_;
    }
    worker_mu_.unlock();
    if (subs_count_.load(std::memory_order_seq_cst) == 0) break;
  }
  activity_.fetch_add(1, std::memory_order_seq_cst);
  // Whatever the op still needs (a pending UCP request, callbacks to run) happens in
  // progress context: wake the progress thread for it. An op that went out whole needs
  // nobody until its answer arrives, which wakes a sleeping progress thread by itself
  // (the worker's event fd) - so the common small write costs no syscall here.
  if (needs_progress || !posted) {
    if (busy_waiters_.load(std::memory_order_seq_cst) == 0) {
      // A progress thread backing off (a waiter drove a moment ago) polls again within
      // kScanPeriod and runs what we queued; the issuing thread usually waits next and
      // runs it first. Waking it would cost a syscall and a context switch per op (a
      // ring-notified write completes right here).
      if (!posted || pt_state_.load(std::memory_order_seq_cst) != kPtBackoff) kick();
    } else {
      wake_blocked_waiter();  // it may be the only one driving progress
    }
  }
}

void UcxCore::drain_submissions_locked() {
  if (subs_count_.load(std::memory_order_acquire) == 0) return;
  std::vector<Op*> subs;
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    subs.swap(subs_);
    subs_count_.store(0, std::memory_order_seq_cst);
  }
  for (Op* op : subs) {
    op->in_active = true;
    op->prev = active_tail_;
    op->next = nullptr;
    (active_tail_ ? active_tail_->next : active_head_) = op;
    active_tail_ = op;
    if (!op->preset.is_ok()) {
      complete(op, std::move(op->preset));
      continue;
    }
    op->ch->enqueue(op);
  }
}

bool UcxCore::pass_locked() {
  bool did = false;
  drain_submissions_locked();
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) did = true;
  if (poll_rings_locked()) did = true;
  if (!hellos_.empty()) {
    handle_hellos_locked();
    did = true;
  }
  for (int round = 0; round < 4 && !dirty_.empty(); ++round) {
    std::vector<UcxChannel*> dirty;
    dirty.swap(dirty_);
    for (UcxChannel* ch : dirty) {
      ch->dirty = false;
      ch->pump();
      ch->flush_acks();
    }
    did = true;
  }
  // Endpoints to close (never closed inside a UCP callback). Always FORCE: a flushing
  // close can wait forever for a dead peer, and ucp_worker_destroy must not find an
  // endpoint with operations still pending.
  if (!to_close_.empty()) {
    const auto now = Clock::now();
    std::vector<ToClose> later;
    auto list = std::move(to_close_);
    to_close_.clear();
    for (auto& c : list) {
      if (c.linger_on != nullptr && c.linger_on->refs > 1 && now < c.deadline &&
          !stop_thread_.load(std::memory_order_acquire)) {
        later.push_back(std::move(c));  // the goodbye is still on its way out
        continue;
      }
      if (c.linger_on != nullptr) release(c.linger_on);
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = ucp_ep_close_nbx(c.ep, &p);
      if (UCS_PTR_IS_PTR(req)) {
        closing_.push_back(Closing{req, std::move(c.rkeys)});
      } else {
        for (ucp_rkey_h k : c.rkeys) ucp_rkey_destroy(k);
      }
    }
    for (auto& c : later) to_close_.push_back(std::move(c));
    did = true;
  }
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i].request) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i].request);
      for (ucp_rkey_h k : closing_[i].rkeys) ucp_rkey_destroy(k);
      closing_[i] = std::move(closing_.back());
      closing_.pop_back();
    } else {
      ++i;
    }
  }
  const auto now = active_head_ ? Clock::now() : Clock::time_point{};
  if (active_head_ && now >= next_scan_) scan_timeouts_locked(now);
  if (!events_.empty()) {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (ready_.empty()) {
      ready_.swap(events_);
    } else {
      for (auto& e : events_) ready_.push_back(std::move(e));
      events_.clear();
    }
    ready_count_.store(ready_.size(), std::memory_order_release);
    did = true;
  }
  return did;
}

bool UcxCore::poll_rings_locked() {
  bool did = false;
  for (size_t i = 0; i < ring_channels_.size();) {
    UcxChannel* ch = ring_channels_[i];
    if (ch->rx_ring() == nullptr) {  // failed
      ring_channels_[i] = ring_channels_.back();
      ring_channels_.pop_back();
      continue;
    }
    if (ch->poll_ring()) did = true;
    ++i;
  }
  return did;
}

bool UcxCore::arm_rings_locked(std::vector<std::shared_ptr<shm::NotifyRing>>& armed) {
  for (UcxChannel* ch : ring_channels_) {
    if (ch->rx_ring() == nullptr) continue;
    ch->rx_ring()->header()->sleepers.fetch_add(1, std::memory_order_seq_cst);
    armed.push_back(ch->rx_ring());
  }
  // The producer stores its tail, fences, then loads sleepers: after our increment,
  // either we see its entry here or it sees us and sends a wake-up message.
  for (UcxChannel* ch : ring_channels_) {
    if (ch->ring_deliverable()) {
      disarm_rings(armed);
      return false;
    }
  }
  return true;
}

void UcxCore::disarm_rings(std::vector<std::shared_ptr<shm::NotifyRing>>& armed) {
  for (auto& r : armed) r->header()->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  armed.clear();
}

bool UcxCore::progress_once(bool* did) {
  bool locked = false;
  bool any = false;
  while (worker_mu_.try_lock()) {
    locked = true;
    if (!stopped()) any |= pass_locked();
    worker_mu_.unlock();
    if (subs_count_.load(std::memory_order_seq_cst) == 0) break;
  }
  if (did != nullptr) *did = any;
  return locked;
}

void UcxCore::dispatch() {
  if (t_dispatching) return;  // a callback is waiting; events stay queued in order
  while (ready_count_.load(std::memory_order_acquire) > 0) {
    if (!dispatch_mu_.try_lock()) return;  // the dispatching thread re-checks after unlocking
    t_dispatching = true;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(ready_mu_);
        if (ready_.empty()) break;
        dispatching_.swap(ready_);
        ready_count_.store(0, std::memory_order_release);
      }
      for (Event& e : dispatching_) {
        try {
          switch (e.kind) {
            case Event::kCallback:
              e.cb(e.status);
              break;
            case Event::kNotify:
              e.inbox->push_notify(e.value);
              break;
            case Event::kMessage:
              e.inbox->push_message(std::move(e.bytes));
              break;
            case Event::kFail:
              e.inbox->fail(e.status);
              break;
          }
        } catch (const std::exception& ex) {
          RDMAFLOW_LOG_ERROR("ucx: a completion callback threw: {}", ex.what());
        } catch (...) {
          RDMAFLOW_LOG_ERROR("ucx: a completion callback threw");
        }
      }
      dispatching_.clear();
      // What was delivered may be what a waiter asleep in drive_blocking waits for.
      wake_blocked_waiter();
    }
    t_dispatching = false;
    dispatch_mu_.unlock();
  }
}

void UcxCore::wake_blocked_waiter() {
  // Pairs with the sleeper's store of blocking_sleeping_ before it checks for work:
  // either it sees what we queued, or we see it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!blocking_sleeping_.load(std::memory_order_seq_cst)) return;
  uint64_t one = 1;
  ssize_t n = ::write(waiter_fd_, &one, sizeof(one));
  (void)n;
}

void UcxCore::kick() {
  if (pt_state_.load(std::memory_order_seq_cst) == kPtRunning) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  (void)n;
}

bool UcxCore::poll_control(int timeout_ms) {
  epoll_event evs[16];
  const int n = ::epoll_wait(control_ep_, evs, 16, timeout_ms);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.u64 == kWakeTag) {
      uint64_t v;
      while (::read(wake_fd_, &v, sizeof(v)) == sizeof(v)) {
      }
    } else {
      on_peer_exit(static_cast<uint32_t>(evs[i].data.u64));
    }
    any = true;
  }
  return any;
}

void UcxCore::progress_thread() {
  auto last_activity = Clock::now();
  auto next_control = last_activity;
  while (!stop_thread_.load(std::memory_order_acquire)) {
    if (busy_waiters_.load(std::memory_order_seq_cst) > 0) {
      // A waiting thread drives progress itself; stay off its core, but keep
      // watching peer processes and deadlines.
      pt_state_.store(kPtBackoff, std::memory_order_seq_cst);
      if (busy_waiters_.load(std::memory_order_seq_cst) > 0) poll_control(1);
      pt_state_.store(kPtRunning, std::memory_order_seq_cst);
      if (busy_waiters_.load(std::memory_order_seq_cst) == 0) {
        // The waiters left: do the housekeeping they may have skipped.
        std::lock_guard<std::mutex> lock(worker_mu_);
        if (active_head_) scan_timeouts_locked(Clock::now());
      }
      last_activity = Clock::now();
      continue;
    }
    bool did = false;
    progress_once(&did);
    dispatch();
    const auto now = Clock::now();
    if (now >= next_control) {
      poll_control(0);
      next_control = now + kScanPeriod;
    }
    if (did) {
      last_activity = now;
      continue;
    }
    if (now - last_activity < options_.progress_spin) {
      cpu_relax();
      continue;
    }
    // Nothing to do for a while: arm the worker's event fd and sleep.
    const uint64_t seen = activity_.load(std::memory_order_seq_cst);
    int timeout_ms = kMaxSleepMs;
    {
      std::unique_lock<std::mutex> lock(worker_mu_);
      if (pass_locked()) {
        lock.unlock();
        dispatch();
        continue;
      }
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      if (!arm_rings_locked(pt_armed_)) continue;
      if (active_head_) {
        Clock::time_point earliest = Clock::time_point::max();
        for (Op* op = active_head_; op; op = op->next) earliest = std::min(earliest, op->deadline);
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 1, kMaxSleepMs));
      }
      if (!closing_.empty() || !to_close_.empty()) timeout_ms = 1;
      pt_state_.store(kPtSleeping, std::memory_order_seq_cst);
    }
    if (activity_.load(std::memory_order_seq_cst) == seen &&
        subs_count_.load(std::memory_order_seq_cst) == 0 &&
        ready_count_.load(std::memory_order_seq_cst) == 0 &&
        busy_waiters_.load(std::memory_order_seq_cst) == 0) {
      epoll_event evs[4];
      ::epoll_wait(sleep_ep_, evs, 4, timeout_ms);
    }
    disarm_rings(pt_armed_);
    pt_state_.store(kPtRunning, std::memory_order_seq_cst);
    poll_control(0);
    next_control = Clock::now() + kScanPeriod;
    last_activity = Clock::now();
  }
  pt_state_.store(kPtStopped, std::memory_order_seq_cst);
}

bool UcxCore::drive(const std::function<bool()>& ready, Clock::time_point deadline) {
  if (stopped() ||
      (!options_.busy_poll && options_.wait_spin.count() == 0 && !options_.wait_block)) {
    return false;
  }
  const auto spin_end =
      options_.busy_poll ? deadline : std::min(deadline, Clock::now() + options_.wait_spin);
  busy_waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool ok = false;
  for (uint32_t i = 0;; ++i) {
    if (ready()) {
      ok = true;
      break;
    }
    if (stopped()) break;
    bool did = false;
    if (!progress_once(&did)) cpu_relax();
    dispatch();
    if ((i & 7) == 7 && Clock::now() >= spin_end) break;
    // On a busy machine the thread we wait for may need this core: let it run now
    // and then (a no-op when nobody else is runnable).
    if (options_.spin_yield > 0 && i % options_.spin_yield == options_.spin_yield - 1) {
      std::this_thread::yield();
    }
  }
  if (!ok && options_.wait_block && !options_.busy_poll && !t_dispatching &&
      Clock::now() < deadline) {
    ok = drive_blocking(ready, deadline);
  }
  const bool last = busy_waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1;
  if (!ok) followers_.fetch_add(1, std::memory_order_seq_cst);
  if (last && followers_.exchange(0, std::memory_order_seq_cst) > 0) {
    // A waiter sleeps on its condition variable and nobody drives: hand progress back.
    activity_.fetch_add(1, std::memory_order_seq_cst);
    kick();
  }
  return ok;
}

void UcxCore::poll() {
  if (stopped()) return;
  progress_once(nullptr);
  dispatch();
}

bool UcxCore::drive_blocking(const std::function<bool()>& ready, Clock::time_point deadline) {
  if (blocking_taken_.exchange(true, std::memory_order_seq_cst)) return false;
  bool ok = false;
  for (;;) {
    if (ready()) {
      ok = true;
      break;
    }
    const auto now = Clock::now();
    if (stopped() || stop_thread_.load(std::memory_order_acquire) || now >= deadline) break;
    // One pass; if it found nothing to do, arm the worker's event fd and sleep on it.
    bool did = false;
    int timeout_ms = 0;
    {
      std::lock_guard<std::mutex> lock(worker_mu_);
      if (stopped()) break;
      did = pass_locked();
      if (!did && ucp_worker_arm(worker_) == UCS_ERR_BUSY) did = true;
      if (!did && !arm_rings_locked(waiter_armed_)) did = true;
      if (!did) {
        Clock::time_point wake = std::min(deadline, now + std::chrono::milliseconds(kMaxSleepMs));
        for (Op* op = active_head_; op; op = op->next) wake = std::min(wake, op->deadline);
        if (!closing_.empty() || !to_close_.empty()) wake = now + std::chrono::milliseconds(1);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 1, kMaxSleepMs));
      }
    }
    dispatch();
    if (did) continue;
    blocking_sleeping_.store(true, std::memory_order_seq_cst);
    // Anything queued or delivered after the pass wakes us through waiter_fd_.
    if (subs_count_.load(std::memory_order_seq_cst) == 0 &&
        ready_count_.load(std::memory_order_seq_cst) == 0 && !ready()) {
      epoll_event evs[4];
      ::epoll_wait(waiter_ep_, evs, 4, timeout_ms);
    }
    disarm_rings(waiter_armed_);
    blocking_sleeping_.store(false, std::memory_order_seq_cst);
    uint64_t v;
    while (::read(waiter_fd_, &v, sizeof(v)) == sizeof(v)) {
    }
    poll_control(0);  // peer exits, the shutdown wake-up
  }
  blocking_taken_.store(false, std::memory_order_seq_cst);
  return ok;
}

// ---------------------------------------------------------------------------
// Peers: pidfds and endpoint errors

void UcxCore::watch_pidfd(int fd, uint32_t channel) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = channel;
  if (::epoll_ctl(control_ep_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    RDMAFLOW_LOG_WARN("ucx: cannot watch peer pidfd: {}", std::strerror(errno));
  }
}

void UcxCore::unwatch_pidfd(int fd) {
  ::epoll_ctl(control_ep_, EPOLL_CTL_DEL, fd, nullptr);
}

void UcxCore::on_peer_exit(uint32_t channel) {
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped() || channel == 0 || channel > channels_.size()) return;
    channels_[channel - 1]->peer_exited();
    pass_locked();
  }
  dispatch();
}

void UcxCore::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ch = static_cast<UcxChannel*>(arg);
  ch->peer_gone = true;
  if (ch->failed()) return;
  ch->fail(RDMAFLOW_ERROR(Code::kPeerFailed, "channel", ch->peer_rank(),
                          std::string("UCX endpoint failed: ") + ucs_status_string(status) +
                              " (the peer exited or the connection broke)"));
}

void UcxCore::retire_ep(ucp_ep_h ep, std::vector<ucp_rkey_h> rkeys, Op* linger_on) {
  to_close_.push_back(
      ToClose{ep, std::move(rkeys), linger_on, Clock::now() + std::chrono::milliseconds(200)});
}

// ---------------------------------------------------------------------------
// Active messages

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
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && length < 4096) {
      core->hellos_.push_back(Hello{static_cast<int>(h.value), static_cast<uint32_t>(h.id),
                                    std::string(static_cast<const char*>(data), length)});
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
  const bool local = same_host(self_identity(), peer.identity);
  int pidfd = -1;
  if (local) {
    RDMAFLOW_ASSIGN_OR_RETURN(pidfd, open_peer_pidfd(peer.identity, peer_rank, op));
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
  for (Hello& h : hellos) {
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
    ch->send_ctrl(MsgType::kHelloAck, ch->id(), {});
    ch->opened();
    {
      std::lock_guard<std::mutex> lock(ctl_mu_);
      accepted_[h.rank].push_back(ch);
    }
    ctl_cv_.notify_all();
  }
}

template <typename Pred>
bool UcxCore::wait_control(Pred pred, Clock::time_point deadline) {
  auto check = [&] {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    return pred() || stopped();
  };
  if (t_dispatching || std::this_thread::get_id() == thread_.get_id() ||
      stop_thread_.load(std::memory_order_acquire)) {
    // Called from a callback, or nobody else drives progress: drive it here.
    while (!check() && Clock::now() < deadline) {
      if (!progress_once(nullptr)) cpu_relax();
    }
    return check();
  }
  kick();
  std::unique_lock<std::mutex> lock(ctl_mu_);
  return ctl_cv_.wait_until(lock, deadline, [&] { return pred() || stopped(); });
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
  std::shared_ptr<UcxChannel> ch;
  {
    std::unique_lock<std::mutex> lock(worker_mu_);
    if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
    RDMAFLOW_ASSIGN_OR_RETURN(ch, make_channel_locked(peer_rank, *peer, op));
    ch->send_ctrl(MsgType::kHello, ch->id(), std::vector<uint8_t>(address_.begin(), address_.end()),
                  0, static_cast<uint64_t>(rank_));
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

// ---------------------------------------------------------------------------
// Memory and grants

Result<RegionId> UcxCore::register_memory(void* addr, size_t len) {
  const char* op = "register memory";
  if (addr == nullptr || len == 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "empty region");
  }
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (a + len < a) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "region wraps around");
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  auto next = region_by_addr_.lower_bound(a);
  if (next != region_by_addr_.end() && next->first < a + len) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "overlaps a registered region");
  }
  if (next != region_by_addr_.begin()) {
    const Region& prev = regions_.at(std::prev(next)->second);
    if (prev.addr + prev.len > a) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "overlaps a registered region");
    }
  }
  Region r;
  r.addr = a;
  r.len = len;
  if (options_.direct && shm_capable_) {
    // Same-host peers will reach it with memcpy (shm/shared_pages.h); others are unaffected.
    auto fd = shm::share_in_place(addr, len);
    if (fd.is_ok()) {
      r.shm = *fd;
    } else {
      RDMAFLOW_LOG_DEBUG("ucx: region at {} ({} bytes) stays private, no direct access: {}", addr,
                         len, fd.status().reason());
    }
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = len;
  ucs_status_t s = ucp_mem_map(context_, &mp, &r.memh);
  if (s != UCS_OK) {
    if (r.shm.fd >= 0) shm::unshare_in_place(r.shm);
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, -1,
                          std::string("ucp_mem_map failed: ") + ucs_status_string(s));
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  s = ucp_rkey_pack(context_, r.memh, &packed, &packed_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, r.memh);
    if (r.shm.fd >= 0) shm::unshare_in_place(r.shm);
    return RDMAFLOW_ERROR(Code::kInternal, op, -1,
                          std::string("ucp_rkey_pack failed: ") + ucs_status_string(s));
  }
  r.rkey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_len);
  ucp_rkey_buffer_release(packed);
  const RegionId id = next_region_++;
  regions_.emplace(id, std::move(r));
  region_by_addr_.emplace(a, id);
  return id;
}

Status UcxCore::deregister_memory(RegionId region) {
  const char* op = "deregister memory";
  std::vector<uint64_t> keys;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return Status::ok();  // everything was released at shutdown
    if (!regions_.count(region)) {
      return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                            "region " + std::to_string(region) + " is not registered");
    }
    for (const auto& [id, g] : grants_) {
      if (g.region == region) keys.push_back(id);
    }
  }
  // Peers stop using the region's keys before the memory goes away.
  Status st = keys.empty() ? Status::ok() : revoke_grants(std::move(keys), op);
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return Status::ok();
  auto it = regions_.find(region);
  if (it == regions_.end()) return st;
  ucp_mem_unmap(context_, it->second.memh);
  if (it->second.shm.fd >= 0) {
    // Every peer confirmed dropping its keys (above); take the pages back private.
    shm::unshare_in_place(it->second.shm);
  }
  region_by_addr_.erase(it->second.addr);
  regions_.erase(it);
  return st;
}

Result<RemoteKey> UcxCore::export_key(const void* addr, size_t len) {
  const char* op = "export key";
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  auto it = region_by_addr_.upper_bound(a);
  if (it == region_by_addr_.begin()) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1, "address is not in a registered region");
  }
  --it;
  const RegionId rid = it->second;
  const Region& r = regions_.at(rid);
  if (a >= r.addr + r.len) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1, "address is not in a registered region");
  }
  if (len > r.addr + r.len - a) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, -1,
                          std::to_string(len) +
                              " bytes from that address run past the end of "
                              "its registered region");
  }
  // splitmix64: secrets only need to be unguessable by accident, not by an attacker.
  rng_state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = rng_state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  RemoteKey key;
  key.backend = "ucx";
  key.key_id = next_key_++;
  key.secret = z;
  key.addr = a;
  key.length = len;
  key.blob = r.rkey;
  grants_.emplace(key.key_id, Grant{key.secret, a, len, rid, {}});
  return key;
}

Status UcxCore::revoke_key(const RemoteKey& key) {
  const char* op = "revoke key";
  if (key.backend != "ucx") {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "remote key belongs to backend '" + key.backend + "', not ucx");
  }
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
    auto it = grants_.find(key.key_id);
    if (it == grants_.end() || it->second.secret != key.secret) {
      return RDMAFLOW_ERROR(
          Code::kNotFound, op, -1,
          "key id " + std::to_string(key.key_id) + " is not an active grant of this transport");
    }
  }
  return revoke_grants({key.key_id}, op);
}

Status UcxCore::revoke_grants(std::vector<uint64_t> key_ids, const char* op) {
  auto remaining = std::make_shared<std::atomic<int>>(0);
  uint64_t round = 0;
  std::vector<int> ranks;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return Status::ok();
    // Notifies already published in our rings were checked by their writers against
    // the grants still valid: deliver them before the grants go.
    poll_rings_locked();
    std::map<uint32_t, std::vector<uint64_t>> per_channel;
    for (uint64_t id : key_ids) {
      auto it = grants_.find(id);
      if (it == grants_.end()) continue;
      for (uint32_t c : it->second.queried_by) per_channel[c].push_back(id);
      grants_.erase(it);  // from now on the receiver refuses it (am path, key queries)
    }
    // Peers that cached an rkey for one of the keys must drop it and confirm, after their
    // last put/get with it completed.
    round = next_round_++;
    RevokeRound rr;
    rr.remaining = remaining;
    for (auto& [cid, ids] : per_channel) {
      UcxChannel* ch = channels_[cid - 1].get();
      if (ch->failed()) continue;
      std::vector<uint8_t> data(ids.size() * 8);
      std::memcpy(data.data(), ids.data(), data.size());
      ch->send_ctrl(MsgType::kRevoke, round, std::move(data));
      rr.waiting.push_back(cid);
      ranks.push_back(ch->peer_rank());
    }
    if (rr.waiting.empty()) return Status::ok();
    remaining->store(static_cast<int>(rr.waiting.size()));
    rounds_.emplace(round, std::move(rr));
    pass_locked();
  }
  dispatch();
  const Millis timeout = default_timeout();
  wait_control([&] { return remaining->load() == 0; }, Clock::now() + timeout);
  if (remaining->load() == 0) return Status::ok();
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    rounds_.erase(round);
  }
  std::string who;
  for (int r : ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
  return RDMAFLOW_ERROR(Code::kTimeout, op, ranks.size() == 1 ? ranks[0] : -1,
                        "revoked here, but peer rank(s) " + who +
                            " did not confirm dropping the key within " +
                            std::to_string(timeout.count()) + " ms");
}

void UcxCore::on_revoke_ack(uint64_t round, uint32_t channel) {
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return;
  auto& w = it->second.waiting;
  auto pos = std::find(w.begin(), w.end(), channel);
  if (pos == w.end()) return;
  w.erase(pos);
  it->second.remaining->fetch_sub(1);
  if (w.empty()) rounds_.erase(it);
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

void UcxCore::notify_control() {
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

void UcxCore::channel_failed(uint32_t channel) {
  std::vector<uint64_t> rounds;
  for (auto& [id, rr] : rounds_) {
    if (std::find(rr.waiting.begin(), rr.waiting.end(), channel) != rr.waiting.end()) {
      rounds.push_back(id);
    }
  }
  for (uint64_t r : rounds) on_revoke_ack(r, channel);
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

Status UcxCore::resolve_grant(uint64_t key_id, uint64_t secret, uint64_t offset, uint64_t len,
                              const char* op, int peer, uint8_t** target) {
  auto it = grants_.find(key_id);
  if (it == grants_.end()) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer,
        "unknown key id " + std::to_string(key_id) + " (never exported here, or revoked)");
  }
  const Grant& g = it->second;
  if (g.secret != secret) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer,
        "wrong secret for key id " + std::to_string(key_id) + " (forged or stale key)");
  }
  if (!(offset <= g.len && len <= g.len - offset)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(g.len) +
                              " bytes granted by key id " + std::to_string(key_id));
  }
  *target = reinterpret_cast<uint8_t*>(g.addr + offset);
  return Status::ok();
}

Status UcxCore::query_grant(uint64_t key_id, uint64_t secret, uint32_t channel, int peer,
                            uint64_t* addr, uint64_t* len, uint64_t* rkey_sum, DirectInfo* direct) {
  uint8_t* target = nullptr;
  RDMAFLOW_RETURN_IF_ERROR(resolve_grant(key_id, secret, 0, 0, "key query", peer, &target));
  Grant& g = grants_.at(key_id);
  if (std::find(g.queried_by.begin(), g.queried_by.end(), channel) == g.queried_by.end()) {
    g.queried_by.push_back(channel);
  }
  *addr = g.addr;
  *len = g.len;
  const Region& r = regions_.at(g.region);
  *rkey_sum = rkey_checksum(r.rkey);
  if (direct != nullptr) {
    direct->fd = r.shm.fd;
    if (r.shm.fd >= 0) {
      direct->region = g.region;
      direct->base = r.shm.base;
      direct->length = r.shm.length;
    }
  }
  return Status::ok();
}

}  // namespace rdmaflow::ucx
