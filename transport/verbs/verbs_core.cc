#include "transport/verbs/verbs_core.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "transport/verbs/verbs_channel.h"

namespace rdmaflow::verbs {

namespace {
constexpr const char* kOpen = "create verbs transport";

Status verbs_error(Code code, const std::string& op, const std::string& call, int err,
                   const std::string& hint = "") {
  std::string reason = call + " failed: " + std::strerror(err);
  if (!hint.empty()) reason += "; " + hint;
  return RDMAFLOW_ERROR(code, op, -1, reason);
}

std::string memlock_hint(int err) {
  if (err == ENOMEM || err == EPERM || err == EAGAIN) {
    return "pinned memory is limited by 'ulimit -l' (RLIMIT_MEMLOCK); raise it, e.g. "
           "'ulimit -l unlimited' or memlock in /etc/security/limits.conf";
  }
  return "";
}
}  // namespace

Result<std::shared_ptr<VerbsCore>> VerbsCore::open(ibv_context* ctx, const VerbsConfig& config,
                                                   PortChoice port, int rank) {
  std::shared_ptr<VerbsCore> core(new VerbsCore());
  core->config_ = config;
  core->port_ = std::move(port);
  core->rank_ = rank;
  core->ctx_ = ctx;
  if (int rc = ibv_query_device(ctx, &core->dev_attr_); rc != 0) {
    return verbs_error(Code::kNotViable, kOpen, "ibv_query_device", rc);
  }
  const auto& da = core->dev_attr_;
  if (da.max_srq == 0 || da.max_srq_wr == 0) {
    return RDMAFLOW_ERROR(Code::kNotViable, kOpen, -1,
                          core->port_.device + " has no shared receive queue support");
  }
  ibv_port_attr pattr{};
  if (int rc = ibv_query_port(ctx, static_cast<uint8_t>(core->port_.port), &pattr); rc != 0) {
    return verbs_error(Code::kNotViable, kOpen, "ibv_query_port", rc);
  }
  core->max_wr_bytes_ = std::min<uint64_t>(pattr.max_msg_sz, uint64_t{1} << 30);
  if (core->max_wr_bytes_ == 0) core->max_wr_bytes_ = uint64_t{1} << 30;
  const bool has_windows =
      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && da.max_mw > 0;
  switch (config.grant_protection) {
    case VerbsConfig::GrantProtection::kWindow:
      if (!has_windows) {
        return RDMAFLOW_ERROR(Code::kNotViable, "create verbs transport", -1,
                              "RDMAFLOW_IB_GRANT_PROTECTION=window, but " + port.device +
                                  " does not support type 2 memory windows (ibv_devinfo -v: "
                                  "MEM_WINDOW_TYPE_2B); use slab or auto");
      }
      core->grant_windows_ = true;
      break;
    case VerbsConfig::GrantProtection::kAuto:
      core->grant_windows_ = has_windows;
      break;
    case VerbsConfig::GrantProtection::kSlab:
      break;
  }

  // Clamp the configured sizes to what the device offers.
  core->sq_depth_ = std::min<uint32_t>(config.sq_depth, static_cast<uint32_t>(da.max_qp_wr));
  core->sq_depth_ = std::min<uint32_t>(core->sq_depth_, static_cast<uint32_t>(da.max_cqe));
  core->max_rd_atomic_ =
      static_cast<uint32_t>(std::max(0, std::min(da.max_qp_rd_atom, da.max_qp_init_rd_atom)));
  uint64_t want = uint64_t{config.max_peers} * config.recv_credits;
  uint64_t cap = std::min<uint64_t>(
      {want, static_cast<uint64_t>(da.max_srq_wr), static_cast<uint64_t>(da.max_cqe)});
  if (cap < config.recv_credits) {
    return RDMAFLOW_ERROR(Code::kNotViable, kOpen, -1,
                          core->port_.device + " allows " + std::to_string(cap) +
                              " receive entries, fewer than RDMAFLOW_IB_RECV_CREDITS=" +
                              std::to_string(config.recv_credits));
  }
  core->srq_capacity_ = static_cast<uint32_t>(cap - cap % config.recv_credits);
  if (core->srq_capacity_ < want) {
    RDMAFLOW_LOG_WARN("verbs: {} limits the shared receive queue to {} entries: at most {} peers",
                      core->port_.device, core->srq_capacity_,
                      core->srq_capacity_ / config.recv_credits);
  }

  core->pd_ = ibv_alloc_pd(ctx);
  if (core->pd_ == nullptr) return verbs_error(Code::kNotViable, kOpen, "ibv_alloc_pd", errno);
  core->comp_ = ibv_create_comp_channel(ctx);
  if (core->comp_ == nullptr) {
    return verbs_error(Code::kNotViable, kOpen, "ibv_create_comp_channel", errno);
  }
  core->recv_cq_ =
      ibv_create_cq(ctx, static_cast<int>(core->srq_capacity_), nullptr, core->comp_, 0);
  if (core->recv_cq_ == nullptr)
    return verbs_error(Code::kNotViable, kOpen, "ibv_create_cq", errno);
  if (int rc = ibv_req_notify_cq(core->recv_cq_, 0); rc != 0) {
    return verbs_error(Code::kNotViable, kOpen, "ibv_req_notify_cq", rc);
  }
  ibv_srq_init_attr sattr{};
  sattr.attr.max_wr = core->srq_capacity_;
  sattr.attr.max_sge = 1;
  core->srq_ = ibv_create_srq(core->pd_, &sattr);
  if (core->srq_ == nullptr) return verbs_error(Code::kNotViable, kOpen, "ibv_create_srq", errno);
  return core;
}

VerbsCore::~VerbsCore() {
  close();
}

void VerbsCore::close() {
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    for (auto& [key_id, g] : grant_mrs_) ibv_dereg_mr(g.mr);
    grant_mrs_.clear();
    for (auto& [id, mr] : mrs_) {
      (void)grants_.remove_region(id);
      if (mr) ibv_dereg_mr(mr);
    }
    mrs_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    if (srq_) ibv_destroy_srq(srq_);
    srq_ = nullptr;
    for (auto& c : chunks_) {
      if (c.mr) ibv_dereg_mr(c.mr);
      std::free(c.base);
    }
    chunks_.clear();
    reserved_ = 0;
  }
  if (recv_cq_) ibv_destroy_cq(recv_cq_);
  recv_cq_ = nullptr;
  if (comp_) ibv_destroy_comp_channel(comp_);
  comp_ = nullptr;
  if (pd_) ibv_dealloc_pd(pd_);
  pd_ = nullptr;
  ctx_ = nullptr;  // owned by rdma_cm's device list
}

// ---------------------------------------------------------------- memory

Result<RegionId> VerbsCore::register_memory(void* addr, size_t len) {
  const char* op = "register memory";
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (pd_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "the verbs transport was shut down");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(RegionId id, grants_.add_region(addr, len));
  // With grant windows the slab itself grants no remote access: its rkey opens
  // nothing, only the windows bound per grant and peer do.
  const int remote =
      grant_windows_ ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = ibv_reg_mr(pd_, addr, len, IBV_ACCESS_LOCAL_WRITE | remote);
  if (mr == nullptr) {
    int err = errno;
    (void)grants_.remove_region(id);
    return verbs_error(Code::kResourceExhausted, op,
                       "ibv_reg_mr(" + std::to_string(len) + " bytes)", err, memlock_hint(err));
  }
  mrs_[id] = mr;
  return id;
}

Status VerbsCore::deregister_memory(RegionId id) {
  std::unique_lock<std::mutex> lock(mem_mu_);
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<uint64_t> gone, grants_.remove_region(id));
  lock.unlock();
  // First the windows bound to the region (a registration with bound windows
  // cannot be released), then the registration.
  for (auto& ch : channels()) {
    for (uint64_t key_id : gone) ch->announce_revoked(key_id);
  }
  lock.lock();
  release_grant_mrs(id);
  auto it = mrs_.find(id);
  int rc = it != mrs_.end() && it->second ? ibv_dereg_mr(it->second) : 0;
  if (it != mrs_.end()) mrs_.erase(it);
  lock.unlock();
  if (rc != 0) return verbs_error(Code::kInternal, "deregister memory", "ibv_dereg_mr", rc);
  return Status::ok();
}

std::optional<LocalMr> VerbsCore::find_mr(const void* addr, size_t len) const {
  auto id = grants_.region_of(addr, len);
  if (!id) return std::nullopt;
  std::lock_guard<std::mutex> lock(mem_mu_);
  auto it = mrs_.find(*id);
  if (it == mrs_.end()) return std::nullopt;
  return LocalMr{it->second->lkey, it->second->rkey, *id};
}

ibv_mr* VerbsCore::mr_for_window(uint64_t key_id) const {
  std::lock_guard<std::mutex> lock(mem_mu_);
  auto it = grant_mrs_.find(key_id);
  return it == grant_mrs_.end() || it->second.revoked ? nullptr : it->second.mr;
}

void VerbsCore::release_grant_mrs(RegionId region) {
  for (auto it = grant_mrs_.begin(); it != grant_mrs_.end();) {
    if (it->second.region != region) {
      ++it;
      continue;
    }
    if (int rc = ibv_dereg_mr(it->second.mr); rc != 0) {
      RDMAFLOW_LOG_WARN("verbs: ibv_dereg_mr of grant {} failed: {}", it->first, std::strerror(rc));
    }
    it = grant_mrs_.erase(it);
  }
}

Result<RemoteKey> VerbsCore::export_key(const void* addr, size_t len) {
  auto mr = find_mr(addr, len);
  if (!mr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "export key", -1,
                          "[" + std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", +" +
                              std::to_string(len) +
                              ") does not lie inside one region registered with the verbs "
                              "transport");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey k, grants_.grant(addr, len, mr->rkey));
  k.blob.resize(4);
  std::memcpy(k.blob.data(), &mr->rkey, 4);
  if (grant_windows_ && len > 0) {
    // The registration its windows bind to (mr_for_window says why).
    ibv_mr* grant_mr =
        ibv_reg_mr(pd_, const_cast<void*>(addr), len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    if (grant_mr == nullptr) {
      const int err = errno;
      (void)grants_.revoke(k);
      return verbs_error(Code::kResourceExhausted, "export key",
                         "ibv_reg_mr(grant of " + std::to_string(len) + " bytes)", err,
                         memlock_hint(err));
    }
    std::lock_guard<std::mutex> lock(mem_mu_);
    grant_mrs_[k.key_id] = GrantMr{grant_mr, mr->id, false};
  }
  return k;
}

Status VerbsCore::check_claim(const KeyClaim& c, int peer) const {
  return grants_.check(c.key_id, c.secret, c.rkey, c.addr, c.length, "check remote key", peer);
}

Status VerbsCore::revoke_key(const RemoteKey& key) {
  RDMAFLOW_RETURN_IF_ERROR(grants_.revoke(key));
  for (auto& ch : channels()) ch->announce_revoked(key.key_id);  // deallocates its windows
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (auto it = grant_mrs_.find(key.key_id); it != grant_mrs_.end()) it->second.revoked = true;
  return Status::ok();
}

// ---------------------------------------------------------------- receive buffers

Status VerbsCore::post_chunk() {
  size_t n = config_.recv_credits;
  size_t bytes = n * config_.msg_size;
  void* base = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (base == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "post receive buffers", -1,
                          "out of memory for " + std::to_string(bytes) + " bytes");
  }
  ibv_mr* mr = ibv_reg_mr(pd_, base, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    int err = errno;
    std::free(base);
    return verbs_error(Code::kResourceExhausted, "post receive buffers", "ibv_reg_mr", err,
                       memlock_hint(err));
  }
  uint64_t first = chunks_.size() * n;
  chunks_.push_back({static_cast<uint8_t*>(base), mr});
  for (size_t i = 0; i < n; ++i) RDMAFLOW_RETURN_IF_ERROR(repost_locked(first + i));
  return Status::ok();
}

Status VerbsCore::reserve_recv_buffers(uint32_t n) {
  std::lock_guard<std::mutex> lock(recv_mu_);
  if (srq_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kCancelled, "reserve receive buffers", -1, "transport shut down");
  }
  if (uint64_t{reserved_} + n > srq_capacity_) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "reserve receive buffers", -1,
                          "all " + std::to_string(srq_capacity_ / config_.recv_credits) +
                              " peer slots of the shared receive queue are in use "
                              "(RDMAFLOW_IB_MAX_PEERS)");
  }
  while (uint64_t{chunks_.size()} * config_.recv_credits < uint64_t{reserved_} + n) {
    RDMAFLOW_RETURN_IF_ERROR(post_chunk());
  }
  reserved_ += n;
  return Status::ok();
}

void VerbsCore::release_recv_buffers(uint32_t n) {
  std::lock_guard<std::mutex> lock(recv_mu_);
  reserved_ = n > reserved_ ? 0 : reserved_ - n;
}

const uint8_t* VerbsCore::recv_buffer(uint64_t wr_id) const {
  std::lock_guard<std::mutex> lock(recv_mu_);
  uint64_t chunk = wr_id / config_.recv_credits;
  if (chunk >= chunks_.size()) return nullptr;
  return chunks_[chunk].base + (wr_id % config_.recv_credits) * config_.msg_size;
}

Status VerbsCore::repost_recv(uint64_t wr_id) {
  std::lock_guard<std::mutex> lock(recv_mu_);
  return repost_locked(wr_id);
}

Status VerbsCore::repost_locked(uint64_t wr_id) {
  if (srq_ == nullptr) return Status::ok();  // shut down: nothing to refill
  uint64_t n = config_.recv_credits;
  uint64_t chunk = wr_id / n;
  if (chunk >= chunks_.size()) {
    return RDMAFLOW_ERROR(Code::kInternal, "post receive buffer", -1,
                          "unknown receive buffer " + std::to_string(wr_id));
  }
  const RecvChunk& c = chunks_[chunk];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(c.base + (wr_id % n) * config_.msg_size);
  sge.length = config_.msg_size;
  sge.lkey = c.mr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(srq_, &wr, &bad); rc != 0) {
    return verbs_error(Code::kInternal, "post receive buffer", "ibv_post_srq_recv", rc);
  }
  return Status::ok();
}

// ---------------------------------------------------------------- channels

void VerbsCore::add_channel(const std::shared_ptr<VerbsChannel>& ch) {
  std::lock_guard<std::mutex> lock(chan_mu_);
  channels_.push_back(ch);
  by_qpn_[ch->qp_num()] = ch;
  by_cq_[ch->send_cq()] = ch;
  by_id_[ch->cm_id()] = ch;
}

void VerbsCore::remove_channel(const VerbsChannel* ch) {
  std::lock_guard<std::mutex> lock(chan_mu_);
  std::erase_if(channels_, [&](const auto& c) { return c.get() == ch; });
  std::erase_if(by_qpn_, [&](const auto& e) { return e.second.get() == ch; });
  std::erase_if(by_cq_, [&](const auto& e) { return e.second.get() == ch; });
  std::erase_if(by_id_, [&](const auto& e) { return e.second.get() == ch; });
}

std::shared_ptr<VerbsChannel> VerbsCore::channel_by_qpn(uint32_t qpn) const {
  std::lock_guard<std::mutex> lock(chan_mu_);
  auto it = by_qpn_.find(qpn);
  return it == by_qpn_.end() ? nullptr : it->second;
}

std::shared_ptr<VerbsChannel> VerbsCore::channel_by_cq(const ibv_cq* cq) const {
  std::lock_guard<std::mutex> lock(chan_mu_);
  auto it = by_cq_.find(cq);
  return it == by_cq_.end() ? nullptr : it->second;
}

std::shared_ptr<VerbsChannel> VerbsCore::channel_by_id(const rdma_cm_id* id) const {
  std::lock_guard<std::mutex> lock(chan_mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<VerbsChannel>> VerbsCore::channels() const {
  std::lock_guard<std::mutex> lock(chan_mu_);
  return channels_;
}

// ---------------------------------------------------------------- progress hand-off

void VerbsCore::defer(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(defer_mu_);
    if (progress_running_) {
      deferred_.push_back(std::move(task));
      uint64_t one = 1;
      ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
      (void)rc;  // a full eventfd counter still wakes the thread
      return;
    }
  }
  task();  // no progress thread (shut down): run here
}

void VerbsCore::defer_callback(Callback cb, Status status) {
  if (!cb) return;
  defer([cb = std::move(cb), status = std::move(status)] { cb(status); });
}

void VerbsCore::run_deferred() {
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(defer_mu_);
    tasks.swap(deferred_);
  }
  for (auto& t : tasks) t();
}

void VerbsCore::set_progress_thread(std::thread::id id, int wake_fd) {
  std::lock_guard<std::mutex> lock(defer_mu_);
  progress_id_ = id;
  wake_fd_ = wake_fd;
  progress_running_ = true;
}

void VerbsCore::clear_progress_thread() {
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(defer_mu_);
    progress_running_ = false;
    progress_id_ = std::thread::id();
    tasks.swap(deferred_);
  }
  for (auto& t : tasks) t();
}

bool VerbsCore::on_progress_thread() const {
  std::lock_guard<std::mutex> lock(defer_mu_);
  return progress_running_ && std::this_thread::get_id() == progress_id_;
}

}  // namespace rdmaflow::verbs
