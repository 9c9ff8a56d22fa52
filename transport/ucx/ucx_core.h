// UcxCore: the state one UCX transport shares with its channels — the UCP
// context and worker, the progress engine, registered regions and grants.
// Defined in ucx_core.cc (options, setup and teardown, connections),
// ucx_progress.cc (ops, submission, progress, dispatch, peer watching) and
// ucx_grants.cc (regions, grants, revocation).
//
// Thread model (docs/ucx.md, "Threads"):
//  - The worker runs in UCS_THREAD_MODE_SERIALIZED; `worker_mu_` serializes
//    every UCP call and guards all protocol state (channels' queues, key
//    caches, the UCX side of regions). Code holding it is "in progress context".
//  - Regions and grants live in `grants_`, the GrantTable every backend shares,
//    which has a lock of its own. Lock order: worker_mu_, then the table's lock,
//    then ctl_mu_. Every call into grants_ (registration, export and revocation,
//    which change it; the checks of the receive paths) is made with worker_mu_
//    held, so the table's lock is never contended: a check costs one
//    uncontended reader lock, and a notify-ring poll one for its whole batch.
//  - Issuing threads never wait for it: write/read/send_message try_lock it and
//    post the operation directly (no thread hop); if another thread holds it,
//    the op goes to a submission queue that the holder drains before unlocking.
//  - Progress is driven by the transport's progress thread, or by a thread
//    blocked in a wait (WaitDriver::drive, for latency). Only one thread drives
//    at a time; the progress thread steps aside while a waiter drives.
//  - User-visible effects (callbacks, inbox deliveries) are queued in progress
//    context and run afterwards, without the worker lock, in order, by whichever
//    thread drives progress ("dispatch"). Never on the thread calling write().
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "allocator/registrar.h"
#include "common/handshake.h"
#include "common/spin_policy.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/common/grant_table.h"
#include "transport/common/op_table.h"
#include "transport/remote_key.h"
#include "transport/shm/notify_ring.h"
#include "transport/shm/shared_pages.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_address.h"
#include "transport/ucx/ucx_wire.h"

namespace rdmaflow::ucx {

using Clock = std::chrono::steady_clock;

// RDMAFLOW_UCX_* knobs (docs/ucx.md, "Configuration").
struct Options {
  enum class DataPath { kAuto, kRma, kAm };
  enum class ErrMode { kAuto, kPeer, kNone };
  DataPath data_path = DataPath::kAuto;
  ErrMode err_mode = ErrMode::kAuto;
  uint64_t eager_max = 8192;  // rma path: writes up to this size travel as an AM
  bool direct = true;         // same-host peers: memcpy through shared pages (shm/shared_pages.h)
  bool notify_ring = true;    // direct channels: notifies go through a ring (shm/notify_ring.h)
  uint32_t ring_slots = 1024;
  // RDMAFLOW_MAX_PEER_QUEUED: out-of-order messages a peer may leave waiting here.
  uint64_t max_peer_queued = uint64_t{1} << 18;
  uint64_t max_message = uint64_t{64} << 20;  // RDMAFLOW_MAX_MESSAGE_BYTES
  bool busy_poll = false;                     // waiters drive progress until their deadline
  bool wait_block = true;    // after spinning, a waiter sleeps on the worker's event fd itself
  uint32_t spin_yield = 16;  // spinning waiters call sched_yield every this many polls (0: never)
  // The acknowledgement of a notifying write waits for the next pass or send (hold_ack()).
  bool hold_acks = true;
  Clock::duration wait_spin = std::chrono::microseconds(50);      // ... or this long
  Clock::duration progress_spin = std::chrono::microseconds(20);  // before the thread sleeps
};
Result<Options> load_options();

class UcxChannel;

enum class OpKind : uint8_t { kWrite, kRead, kMessage, kRevokeAck, kCtrl };

// One operation, from issue to its last UCP completion. Pooled in the core's
// OpTable; touched by the issuing thread until submit(), then only in progress
// context, where it is listed in the core's OpLedger until its callback is queued
// (OpRecord::completed: exactly once).
struct Op : OpRecord {
  OpKind kind = OpKind::kCtrl;
  bool put_path = false;      // rma path: ucp_put_nbx / ucp_get_nbx
  bool notify_stage = false;  // put done, the ordered kNotify AM is next
  bool has_notify = false;
  int refs = 0;   // reasons the op must stay allocated (see UcxCore::release)
  int parts = 0;  // completions still needed before success
  UcxChannel* ch = nullptr;
  Callback done;
  Status preset;  // an error found at issue time, reported from progress context
  uint64_t seq = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t len = 0;
  uint64_t offset = 0;
  uint64_t notify = 0;
  uint64_t key_id = 0, key_addr = 0, key_length = 0;
  KeySecret key_secret;
  std::vector<uint8_t> blob;   // packed rkey, when the channel may not have it cached yet
  std::vector<uint8_t> bytes;  // message / control payload
  AmHeader hdr;                // must outlive the UCP send
  Op* qnext = nullptr;         // channel send queue

  const char* name() const;
};

class UcxCore final : public WaitDriver, public std::enable_shared_from_this<UcxCore> {
 public:
  static Result<std::shared_ptr<UcxCore>> create(const TransportConfig& config);
  ~UcxCore() override;
  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  // ---- Transport API ----
  const std::string& address() const { return address_; }
  Result<std::shared_ptr<Channel>> connect(int peer_rank, const std::string& address,
                                           Millis timeout);
  Result<std::shared_ptr<Channel>> accept(int peer_rank, Millis timeout);
  Result<RegionId> register_memory(void* addr, size_t len);
  Status deregister_memory(RegionId region);
  Result<RemoteKey> export_key(const void* addr, size_t len);
  Status revoke_key(const RemoteKey& key);
  void shutdown();

  // ---- WaitDriver ----
  bool drive(const std::function<bool()>& ready, Clock::time_point deadline) override;
  void poll() override;

  // ---- for channels: issuing threads ----
  const Options& options() const { return options_; }
  int rank() const { return rank_; }
  Op* new_op(OpKind kind, UcxChannel* ch, Callback done, Millis timeout);
  // Hands the op to progress context (posting it right away when the worker is free).
  void submit(Op* op);
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  // ---- for channels: progress context (worker_mu_ held) ----
  ucp_worker_h worker() const { return worker_; }
  ucp_context_h context() const { return context_; }
  // Queues the op's callback with `st` (first call wins) and drops the user reference.
  void complete(Op* op, Status st);
  // One more completion of a multi-part op; the op succeeds when all parts are in.
  void part_done(Op* op, const Status& st);
  // Completes every op of `ch` whose callback is still pending with `st`.
  void complete_channel_ops(UcxChannel* ch, const Status& st);
  void add_ref(Op* op) { ++op->refs; }
  // A UCP call returned a request: it needs progress to complete.
  void note_request() { request_posted_ = true; }
  void release(Op* op);
  Op* ctrl_op(UcxChannel* ch);  // an internal op (no callback) for control sends
  void emit_notify(Inbox& inbox, uint64_t value);
  void emit_message(Inbox& inbox, std::vector<uint8_t> bytes);
  void emit_inbox_failure(Inbox& inbox, Status st);
  void mark_dirty(UcxChannel* ch);
  // The acknowledgement `ch` owes waits until the next progress pass or submission:
  // the notify just delivered usually releases a waiter that answers at once, and
  // the acknowledgement sent behind that answer rides on its wake-up of the peer
  // instead of waking a sleeping peer by itself first (ucx.md, "Acknowledgements").
  void hold_ack(UcxChannel* ch);
  bool release_acks_locked();  // sends the held acknowledgements; true if there were any
  // Closes `ep` (FORCE) after the current UCP callback, once `linger_on` (if any, a
  // referenced op) has been sent or 200 ms passed; destroys `rkeys` when it is closed.
  void retire_ep(ucp_ep_h ep, std::vector<ucp_rkey_h> rkeys, Op* linger_on);
  // The grants incoming accesses are checked against (see the lock order above).
  const GrantTable& grants() const { return grants_; }
  // Grant (address, length) for a key query; records `channel` as a user of the key.
  // `direct` (if given) describes the region's shared segment, when it has one.
  Status query_grant(uint64_t key_id, const KeySecret& secret, uint32_t channel, int peer,
                     uint64_t* addr, uint64_t* len, uint64_t* rkey_sum, DirectInfo* direct);
  void on_revoke_ack(uint64_t round, uint32_t channel);
  void channel_failed(uint32_t channel);  // stops revocation rounds waiting for it
  void notify_control();                  // wakes connect/accept/revoke waiters
  void unwatch_pidfd(int fd);

 private:
  // UCX's side of a region of grants_, under the same RegionId.
  struct Region {
    ucp_mem_h memh = nullptr;
    std::vector<uint8_t> rkey;  // packed once
    shm::SharedRange shm;       // the pages re-backed by a memfd (fd -1: none)
    bool closing = false;       // being deregistered: exports refused, peers dropping its keys
  };
  struct RevokeRound {
    std::vector<uint32_t> waiting;  // channel ids
    std::shared_ptr<std::atomic<int>> remaining;
  };
  struct Hello {
    int rank = 0;
    uint32_t remote_channel = 0;
    std::string address;
    std::vector<uint8_t> auth_hello;  // the job handshake's hello (common/handshake.h)
  };
  struct Event {
    enum Kind : uint8_t { kCallback, kNotify, kMessage, kFail } kind = kCallback;
    Callback cb;
    Status status;
    Inbox* inbox = nullptr;
    uint64_t value = 0;
    std::vector<uint8_t> bytes;
  };
  struct Closing {
    void* request = nullptr;
    std::vector<ucp_rkey_h> rkeys;
  };
  struct ToClose {
    ucp_ep_h ep = nullptr;
    std::vector<ucp_rkey_h> rkeys;
    Op* linger_on = nullptr;
    Clock::time_point deadline;
  };
  enum PtState : int { kPtRunning, kPtBackoff, kPtSleeping, kPtStopped };

  UcxCore(const TransportConfig& config, Options options);
  Status init(const TransportConfig& config);

  // Progress (ucx_progress.cc).
  void progress_thread();
  // Tries to make progress; false when another thread holds the worker.
  bool progress_once(bool* did_something);
  // worker_mu_ held: one pass (submissions, UCP progress, channel work, timeouts).
  bool pass_locked();
  void drain_submissions_locked();
  void dispatch();
  void kick();
  bool poll_control(int timeout_ms);
  // drive(), after the spin: this waiter sleeps on the worker's event fd itself and
  // drives progress whenever it wakes, so an arriving message wakes it directly (no
  // progress-thread hop, no condition variable). One such waiter at a time; false if
  // another one already is (this one then sleeps on its condition variable).
  bool drive_blocking(const std::function<bool()>& ready, Clock::time_point deadline);
  void wake_blocked_waiter();  // if a waiter sleeps in drive_blocking, wakes it
  void drain_ring_wakes();     // after sleeping: resets ring_wake_fd_
  // Before a thread sleeps on the worker's event fd (worker_mu_ held): counts it as
  // a sleeper of every notify ring, then rechecks the rings (consumer half of the
  // ring's wake-up protocol). False, with `armed` empty again: an entry is waiting,
  // do not sleep. After sleeping, disarm_rings(armed).
  bool arm_rings_locked(std::vector<std::shared_ptr<shm::NotifyRing>>& armed);
  static void disarm_rings(std::vector<std::shared_ptr<shm::NotifyRing>>& armed);
  bool poll_rings_locked();
  // The deadline sweep over the ops with a pending callback.
  void scan_timeouts_locked(Clock::time_point now);
  // Control-plane wait (connect, accept, revoke) on ctl_cv_; drives progress itself when
  // nobody else can (called from a callback, or after the progress thread stopped).
  bool wait_control(const std::function<bool()>& pred, Clock::time_point deadline);
  void watch_pidfd(int fd, uint32_t channel);
  void on_peer_exit(uint32_t channel);
  // control_ep_'s event for wake_fd_; a peer's pidfd carries its channel id (from 1).
  static constexpr uint64_t kWakeTag = 0;
  // sleep_ep_'s and waiter_ep_'s events: what woke a sleeper.
  static constexpr uint64_t kWorkerTag = 1, kControlTag = 2, kWaiterTag = 3, kRingWakeTag = 4;

  // Setup and connections (ucx_core.cc).
  void wait_closing_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void handle_hellos_locked();
  // A channel whose connector proved the job secret: accept() may hand it out.
  void authenticated_locked(UcxChannel* ch);
  Result<std::shared_ptr<UcxChannel>> make_channel_locked(int peer_rank, const PeerAddress& peer,
                                                          const char* op);
  Options::DataPath choose_data_path(ucp_ep_h ep, std::string* lanes) const;

  // Grants (ucx_grants.cc).
  // Tells the peers that may have cached one of `key_ids` (already revoked in
  // grants_) and waits until each confirmed dropping them. Called with `lock`
  // (worker_mu_) held; returns with it released.
  Status confirm_revoked(std::unique_lock<std::mutex>& lock, const std::vector<uint64_t>& key_ids,
                         const char* op);

  const int rank_;
  const Options options_;
  std::string ifname_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  bool shm_capable_ = false;  // UCX has a shared-memory transport: registration shares memory
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  int control_ep_ = -1;    // epoll: wake_fd_ + peer pidfds
  int sleep_ep_ = -1;      // epoll: worker_fd_ + control_ep_ + ring_wake_fd_
  int waiter_fd_ = -1;     // eventfd: wakes the waiter sleeping in drive_blocking
  int waiter_ep_ = -1;     // epoll: worker_fd_ + control_ep_ + waiter_fd_ + ring_wake_fd_
  int ring_wake_fd_ = -1;  // eventfd: peers publishing in our notify rings wake sleepers
  std::atomic<bool> blocking_taken_{false};     // a waiter is in drive_blocking
  std::atomic<bool> blocking_sleeping_{false};  // ... and asleep in epoll_wait
  std::atomic<int> followers_{0};  // waiters that went to their condition variable meanwhile
  SpinPolicy spin_policy_{options_.wait_spin};  // how long drive() spins before it sleeps

  std::mutex worker_mu_;
  std::atomic<int> busy_waiters_{0};
  std::atomic<int> pt_state_{kPtRunning};
  std::atomic<uint64_t> activity_{0};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> stop_thread_{false};
  std::thread thread_;

  std::mutex sub_mu_;
  std::vector<Op*> subs_;
  std::atomic<size_t> subs_count_{0};

  // Progress context (worker_mu_).
  bool request_posted_ = false;
  std::vector<Event> events_;
  std::vector<UcxChannel*> dirty_;
  std::vector<UcxChannel*> held_acks_;      // channels whose acknowledgement hold_ack() held
  std::atomic<size_t> held_count_{0};       // held_acks_.size(), read without the lock
  std::vector<UcxChannel*> ring_channels_;  // channels with a notify ring we consume
  std::vector<std::shared_ptr<shm::NotifyRing>> pt_armed_;      // the progress thread's, asleep
  std::vector<std::shared_ptr<shm::NotifyRing>> waiter_armed_;  // drive_blocking's, asleep
  std::vector<std::shared_ptr<UcxChannel>> channels_;           // index = channel id - 1
  std::vector<Hello> hellos_;
  // Hellos queued between two progress passes, at most RDMAFLOW_AUTH_PENDING_MAX:
  // a flood of them is dropped in the callback instead of piling up.
  const size_t max_hellos_ = static_cast<size_t>(auth::max_pending_handshakes());
  std::vector<ToClose> to_close_;
  std::vector<Closing> closing_;
  OpLedger<Op> active_;  // ops whose callback is still pending, oldest first
  Clock::time_point next_scan_{};
  GrantTable grants_{"ucx"};
  std::unordered_map<RegionId, Region> regions_;
  // Key id -> channels whose peer may have cached an rkey or mapping for it.
  std::unordered_map<uint64_t, std::vector<uint32_t>> queried_by_;
  std::unordered_map<uint64_t, RevokeRound> rounds_;
  uint64_t next_round_ = 1;

  // Dispatch.
  std::mutex ready_mu_;
  std::vector<Event> ready_;
  std::atomic<size_t> ready_count_{0};
  std::mutex dispatch_mu_;
  std::vector<Event> dispatching_;

  // Op pool: taken by issuing threads, returned in progress context.
  std::mutex pool_mu_;
  OpTable<Op> ops_;  // (pool_mu_)

  // Control plane: connect/accept/revoke waiters (never held with worker_mu_ taken after it).
  std::mutex ctl_mu_;
  std::condition_variable ctl_cv_;
  std::map<int, std::deque<std::shared_ptr<UcxChannel>>> accepted_;

  friend class UcxChannel;
  friend std::shared_ptr<shm::NotifyRing> notify_ring_for_testing(Channel& channel);
  friend bool skip_sequence_numbers_for_testing(Channel& channel, uint64_t n);
};

}  // namespace rdmaflow::ucx
