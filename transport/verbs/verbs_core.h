// VerbsCore: the device-wide state one verbs transport shares with its
// channels. It outlives the Transport object while any Channel still points at
// it; every verbs resource in it is released by close() (Transport::shutdown).
//
//   protection domain        one, for user memory, rings, buffers and QPs
//   completion channel       one, read by the progress thread; every CQ uses it
//   receive CQ + SRQ         shared by every QP: SENDs and RDMA_WRITE_WITH_IMMs
//                            land in buffers of one pool; each channel reserves
//                            `recv_credits` of them (see flow_control.h)
//   memory regions           one ibv_mr per registered slab, looked up by address
//   grants                   exported RemoteKeys (key_id / secret bookkeeping)
//   deferred callbacks       so every user callback runs on the progress thread
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "allocator/registrar.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/common/grant_table.h"
#include "transport/remote_key.h"
#include "transport/verbs/config.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaflow::verbs {

class VerbsChannel;

struct LocalMr {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  RegionId id = 0;
};

class VerbsCore {
 public:
  // Opens the resources on `ctx` (a context owned by rdma_cm's device list).
  static Result<std::shared_ptr<VerbsCore>> open(ibv_context* ctx, const VerbsConfig& config,
                                                 PortChoice port, int rank);
  ~VerbsCore();
  VerbsCore(const VerbsCore&) = delete;
  VerbsCore& operator=(const VerbsCore&) = delete;

  const VerbsConfig& config() const { return config_; }
  const PortChoice& port() const { return port_; }
  const ibv_device_attr& device_attr() const { return dev_attr_; }
  int rank() const { return rank_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_comp_channel* comp_channel() const { return comp_; }
  ibv_cq* recv_cq() const { return recv_cq_; }
  ibv_srq* srq() const { return srq_; }
  uint32_t sq_depth() const { return sq_depth_; }
  uint32_t max_rd_atomic() const { return max_rd_atomic_; }
  // Largest byte count one work request moves (the port's max_msg_sz, capped at 1 GiB).
  uint64_t max_wr_bytes() const { return max_wr_bytes_; }
  // A memory window per grant and peer (RDMAFLOW_IB_GRANT_PROTECTION, config.h).
  bool grant_windows() const { return grant_windows_; }

  // --- registered memory ---
  Result<RegionId> register_memory(void* addr, size_t len);
  Status deregister_memory(RegionId id);
  // The MR holding all of [addr, addr + len), if any.
  std::optional<LocalMr> find_mr(const void* addr, size_t len) const;
  // The registration a window over grant `key_id` binds to (grant windows): the
  // grant's own, made by export_key, because a device may check a window access
  // against the range of the registration under it rather than the window's
  // (rdma_rxe on Linux 6.1 does).
  ibv_mr* mr_for_window(uint64_t key_id) const;
  Result<RemoteKey> export_key(const void* addr, size_t len);
  // Forgets the grant and tells every channel's peer (KeyRevoked), so their
  // cached verdicts go; an access already in flight may still land.
  Status revoke_key(const RemoteKey& key);
  // The target's answer to a KeyCheck: OK when `claim` is a live grant of this
  // transport (key_id, secret and rkey match) and its range lies inside the
  // grant; kNotFound or kOutOfRange with the reason otherwise.
  Status check_claim(const KeyClaim& claim, int peer) const;

  // --- receive buffers behind the shared receive queue ---
  // Reserves `n` buffers for a new channel, growing the posted pool if needed.
  Status reserve_recv_buffers(uint32_t n);
  void release_recv_buffers(uint32_t n);
  // Bytes of receive buffer `wr_id` (as returned in the work completion).
  const uint8_t* recv_buffer(uint64_t wr_id) const;
  uint32_t recv_buffer_size() const { return config_.msg_size; }
  Status repost_recv(uint64_t wr_id);

  // --- channels, by QP number, send CQ and cm id ---
  void add_channel(const std::shared_ptr<VerbsChannel>& ch);
  void remove_channel(const VerbsChannel* ch);
  std::shared_ptr<VerbsChannel> channel_by_qpn(uint32_t qpn) const;
  std::shared_ptr<VerbsChannel> channel_by_cq(const ibv_cq* cq) const;
  std::shared_ptr<VerbsChannel> channel_by_id(const rdma_cm_id* id) const;
  std::vector<std::shared_ptr<VerbsChannel>> channels() const;

  // --- progress thread hand-off ---
  // Runs `task` on the progress thread (or right here once it has stopped).
  void defer(std::function<void()> task);
  void defer_callback(Callback cb, Status status);
  // Runs queued tasks; the progress thread calls this each turn.
  void run_deferred();
  void set_progress_thread(std::thread::id id, int wake_fd);
  void clear_progress_thread();
  bool on_progress_thread() const;

  // Releases every verbs resource. Channels must have released theirs first.
  void close();

 private:
  VerbsCore() = default;
  struct RecvChunk {
    uint8_t* base = nullptr;
    ibv_mr* mr = nullptr;
  };
  Status post_chunk();  // recv_mu_ held
  Status repost_locked(uint64_t wr_id);

  VerbsConfig config_;
  PortChoice port_;
  ibv_device_attr dev_attr_{};
  int rank_ = 0;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
  uint32_t sq_depth_ = 0;
  uint32_t srq_capacity_ = 0;
  uint32_t max_rd_atomic_ = 0;
  uint64_t max_wr_bytes_ = 0;
  bool grant_windows_ = false;

  GrantTable grants_{"verbs"};  // regions and grants; each grant's tag is its slab's rkey
  mutable std::mutex mem_mu_;
  std::unordered_map<RegionId, ibv_mr*> mrs_;  // the registration of each region
  // Grant windows: each grant's registration, by key id. Kept after a revoke
  // (the windows are the fence; the registration grants no remote access) until
  // its region is deregistered: rdma_rxe stalls a read being served from a
  // registration released under it, instead of failing it.
  struct GrantMr {
    ibv_mr* mr = nullptr;
    RegionId region = 0;
    bool revoked = false;
  };
  std::unordered_map<uint64_t, GrantMr> grant_mrs_;
  void release_grant_mrs(RegionId region);  // mem_mu_ held

  mutable std::mutex recv_mu_;
  std::vector<RecvChunk> chunks_;  // each holds recv_credits buffers
  uint32_t reserved_ = 0;

  mutable std::mutex chan_mu_;
  std::vector<std::shared_ptr<VerbsChannel>> channels_;
  std::unordered_map<uint32_t, std::shared_ptr<VerbsChannel>> by_qpn_;
  std::unordered_map<const void*, std::shared_ptr<VerbsChannel>> by_cq_;
  std::unordered_map<const void*, std::shared_ptr<VerbsChannel>> by_id_;

  mutable std::mutex defer_mu_;
  std::vector<std::function<void()>> deferred_;
  std::thread::id progress_id_;
  int wake_fd_ = -1;
  bool progress_running_ = false;
};

}  // namespace rdmaflow::verbs
