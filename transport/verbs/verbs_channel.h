// VerbsChannel: one RC queue pair to one peer, keeping the channel contract.
//
//   write   RDMA_WRITE, or RDMA_WRITE_WITH_IMM when a notify is given (notify.h)
//   read    RDMA_READ
//   send    SEND of [8-byte header | payload] into the peer's pre-posted
//           receive buffers, split into fragments when larger than one buffer
//
// Every operation becomes one or more work items queued behind a SendWindow
// (flow_control.h); an item is posted when send-queue slots, receive credits
// (SENDs and immediates) and a send buffer (SENDs) are all available. The
// progress thread drives completions; every callback runs there, exactly once.
//
// Remote keys: the NIC checks only the slab's rkey, so before the first write
// or read with a RemoteKey the channel asks the target (KeyCheck, verbs_wire.h)
// whether key_id, secret, rkey and range form a live grant, and caches the
// verdict. Work items with an unverified key wait at the head of the queue; a
// refused key fails its operations with kNotFound / kOutOfRange and the
// channel carries on. revoke_key() on the target drops the verdict (KeyRevoked).
//
// Grant windows (RDMAFLOW_IB_GRANT_PROTECTION, config.h; grant_windows.cc): when
// the target vouches for a key it binds a type 2 memory window over the grant on
// this queue pair (ahead of the verdict, which carries the window's rkey) and the
// initiator uses that rkey; the slab's own rkey opens nothing. Revoking the grant
// (or deregistering its memory) deallocates the window: from then on the NIC
// refuses the key, and an access still in flight breaks the channel.
//
// Timeouts (the shared deadline sweep, transport/common/op_table.h): an
// operation not yet posted is withdrawn with kTimeout. A posted one is reported
// as kTimeout too, but a work request cannot be recalled: it may still execute.
// RC completes work requests in order, so once a later operation on the channel
// has completed, the timed-out one is finished too.
//
// Authentication (verbs_wire.h): the acceptor's channel is created with a
// pending auth::Acceptor and its queue pair allows no remote access; the first
// message from the peer must be the proof (type 6), and until it checked the
// channel reads nothing else and the NIC refuses every RDMA write and read, so
// nothing an unauthenticated peer sends reaches registered memory. The
// connector's proof is the first message it queues.
//
// A failed work completion, a disconnect or a protocol violation makes the
// error sticky: the QP is moved to the error state (no late DMA touches memory
// of operations already reported) and every pending operation fails with it.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/handshake.h"
#include "transport/channel.h"
#include "transport/common/op_table.h"
#include "transport/common/sticky_error.h"
#include "transport/verbs/flow_control.h"
#include "transport/verbs/notify.h"
#include "transport/verbs/verbs_core.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaflow::verbs {

class VerbsChannel final : public Channel, public std::enable_shared_from_this<VerbsChannel> {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates the send CQ, the RC QP on `id` (attached to the shared receive
  // queue) and the notify ring, and reserves receive buffers for the peer.
  static Result<std::shared_ptr<VerbsChannel>> create(std::shared_ptr<VerbsCore> core,
                                                      rdma_cm_id* id);
  ~VerbsChannel() override;

  // Our half of the connection hello.
  Hello local_hello() const;
  // The peer's hello arrived: sets the peer rank, credits, ring; allocates send buffers.
  Status set_peer(const Hello& peer);
  // The QP is ready to send (RTS and the peer's hello known); posts what waits.
  void mark_connected();

  // --- authentication ---
  // Acceptor side, before rdma_accept: the peer must prove the job secret with
  // its first message; `on_authenticated` runs on the progress thread once it did.
  void expect_proof(std::unique_ptr<auth::Acceptor> acceptor, std::string who,
                    std::function<void()> on_authenticated);
  // Connector side: the proof (and our Hello) go out before anything else.
  void queue_proof(std::span<const uint8_t> proof);
  // Allows or refuses RDMA writes and reads from the peer on the queue pair
  // (the acceptor refuses them until the proof checked).
  Status set_remote_access(bool allow);
  // The acceptor's channel is ready to hand out: authenticated and ESTABLISHED.
  bool ready_to_accept() const;

  // --- Channel ---
  int peer_rank() const override;
  std::string backend() const override { return "verbs"; }
  ChannelCapabilities capabilities() const override { return {.any_source_memory = false}; }
  void write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
             std::optional<uint64_t> notify, Callback done, Millis timeout) override;
  void read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
            Millis timeout) override;
  void send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) override;
  void close() override;
  Status error() const override;

  // --- progress thread ---
  void poll_send_cq();
  void handle_recv(const ibv_wc& wc);
  // Ahead of handle_recv, for every completion polled with it: a KeyRevoked
  // drops its verdicts now (VerbsTransport::poll_recv_cq says why). Consumes
  // nothing; handle_recv sees the message again.
  void apply_revocation(const ibv_wc& wc);
  void on_disconnected(const std::string& event);
  // rdma_cm reported ESTABLISHED: sends a disconnect that had to wait for it.
  void on_established();
  // The local transport revoked a grant: tell the peer (KeyRevoked).
  void announce_revoked(uint64_t key_id);
  // A fatal error reported outside a work completion (async event, CM error).
  void fail(Status error);
  void check_timeouts(Clock::time_point now);

  uint32_t qp_num() const { return qp_num_; }
  ibv_cq* send_cq() const { return send_cq_; }
  rdma_cm_id* cm_id() const { return id_; }

  // Releases the QP, the send CQ, the MRs and (once create() returned it) the
  // cm id. Only when no work
  // request was ever posted, or once the progress thread has stopped.
  void destroy_resources();

 private:
  // One operation. Its parts are work items, first queued in the SendWindow,
  // then in flight (inflight_) until the NIC completes them, and every part
  // shares the op; a timed-out op's posted parts stay in flight (a work request
  // cannot be recalled) after its callback ran. So ops are shared by their parts
  // (shared_ptr) instead of living in an OpTable, whose slot would be recycled
  // while the NIC still owns a part. From submit() until its callback is queued
  // an op is listed in pending_, the shared ledger: exactly-once completion, the
  // deadline sweep and the timeout wording are the ones every backend uses.
  struct Op : OpRecord {
    const char* what = "operation";  // "write", "read", "send message"
    Callback done;
    uint32_t parts_total = 1;
    uint32_t parts_posted = 0;
    uint32_t parts_done = 0;
    const char* name() const { return what; }
  };
  enum class Kind : uint8_t { kWrite, kRead, kSend };
  struct WorkItem {
    std::shared_ptr<Op> op;
    Kind kind = Kind::kWrite;
    uint64_t local = 0;  // local address (write source / read destination)
    uint32_t length = 0;
    uint32_t lkey = 0;
    uint64_t remote = 0;
    uint32_t rkey = 0;
    std::optional<uint64_t> notify;
    std::optional<KeyClaim> key;                          // kWrite / kRead: must be verified
    std::shared_ptr<const std::vector<uint8_t>> payload;  // kSend
    size_t frag_offset = 0;
    bool last = true;
  };
  struct InFlight {
    std::shared_ptr<Op> op;  // null for credit messages
    uint32_t slots = 1;
    int send_buf = -1;
  };
  using Tasks = std::vector<std::function<void()>>;
  struct KeyState {
    bool valid = false;    // the target vouched for it
    uint64_t request = 0;  // the KeyCheck awaiting a verdict
    uint32_t rkey = 0;     // the window the target bound for it (0: the key's own rkey)
  };
  // A message to SEND, or (bind) a memory window to bind ahead of the verdict.
  struct Control {
    MsgType type;
    std::vector<uint8_t> payload;
    ibv_mw* bind = nullptr;
    ibv_mw_bind_info bind_info{};
    uint32_t bind_rkey = 0;
  };
  // A memory window this channel's peer may use for one grant (the target's side).
  struct Window {
    ibv_mw* mw = nullptr;
    uint32_t rkey = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
  };

  explicit VerbsChannel(std::shared_ptr<VerbsCore> core);

  // Issuing and posting: verbs_send.cc; receive completions and control
  // messages: verbs_recv.cc; failure, timeouts and callbacks: verbs_channel.cc.
  std::shared_ptr<Op> make_op(const char* name, Callback done, Millis timeout, uint32_t parts);
  // Validates a RemoteKey for an access of `len` bytes at `offset`.
  Result<uint32_t> check_key(const char* op, const RemoteKey& key, uint64_t offset,
                             uint64_t len) const;
  void reject(Callback done, Status status);
  // Queues items (under mu_) unless the channel failed; pumps; runs callbacks.
  void submit(std::vector<WorkItem> items, const std::shared_ptr<Op>& op);

  bool resources_ready(const WorkItem& item) const;
  void pump_locked(Tasks& out);
  void post_item_locked(WorkItem item, uint32_t slots, Tasks& out);
  void post_credit_message_locked(Tasks& out);
  void post_control_locked(const Control& c, Tasks& out);
  // Makes sure a KeyCheck for `claim` is on its way (or answered).
  void request_key_check_locked(const KeyClaim& claim);
  // The peer revoked key_id: its verdicts go (the next access asks again).
  void drop_verdicts_locked(uint64_t key_id);
  void on_control_locked(const MsgHeader& h, std::span<const uint8_t> payload, Tasks& out);
  // The acceptor's first receive: the proof, or the reason the peer is refused.
  Status on_proof_locked(const ibv_wc& wc, std::span<const uint8_t> bytes, Tasks& out);
  Status set_peer_locked(const Hello& peer);
  // Grant windows (grant_windows.cc): the window for a vouched-for claim, bound
  // (queued ahead of the verdict) if there is none yet; its rkey.
  Result<uint32_t> window_for_locked(const KeyClaim& claim);
  void post_bind_locked(const Control& c, Tasks& out);
  // Deallocates the window of `key_id` (nullopt: every window), binds not yet posted included.
  void drop_windows_locked(std::optional<uint64_t> key_id);
  // The rkey an item's RDMA operation presents: the window's, else the key's own.
  uint32_t remote_rkey_locked(const WorkItem& item) const;
  Status set_remote_access_locked(bool allow);
  bool post_locked(ibv_send_wr* wr, const char* what, Tasks& out);
  void on_send_wc_locked(const ibv_wc& wc, Tasks& out);
  // Exactly once per op (later calls do nothing): queues its callback.
  void finish_op_locked(Op* op, const Status& status, Tasks& out);
  void fail_locked(Status error, Tasks& out);
  // Runs tasks here on the progress thread, or hands them to it.
  void run_tasks(Tasks& tasks);
  void release_recv_reservation_locked();

  std::shared_ptr<VerbsCore> core_;
  rdma_cm_id* id_ = nullptr;
  bool owns_id_ = false;
  ibv_qp* qp_ = nullptr;
  uint32_t qp_num_ = 0;
  ibv_cq* send_cq_ = nullptr;
  uint32_t local_credits_ = 0;

  // Our notify ring, written by the peer (see notify.h).
  uint64_t* ring_ = nullptr;
  ibv_mr* ring_mr_ = nullptr;
  // Staging copies of ring notifies + SEND buffers, one MR.
  uint8_t* send_mem_ = nullptr;
  ibv_mr* send_mr_ = nullptr;
  uint32_t send_buf_size_ = 0;
  uint32_t send_buf_count_ = 0;

  mutable std::mutex mu_;
  // Acceptor side until the peer's proof checked (then null); `who_` names the
  // peer by address in the refusal.
  std::unique_ptr<auth::Acceptor> acceptor_;
  std::string who_;
  std::function<void()> on_authenticated_;
  Hello peer_;
  int peer_rank_ = -1;
  bool recv_reserved_ = false;
  bool connected_ = false;
  bool closed_ = false;
  // The CM connection is ESTABLISHED (a DREQ can be sent). A passive side that
  // fails before (a message overtook the RTU) defers its disconnect.
  bool cm_established_ = false;
  bool disconnect_deferred_ = false;
  StickyError error_;  // set under mu_ (fail_locked); ok() read anywhere without it
  SendWindow<WorkItem> window_;
  CreditCounter credits_;
  NotifyEncoder encoder_{0};
  MessageReassembler reassembler_;
  std::unordered_map<uint64_t, InFlight> inflight_;
  // Ops not yet completed, oldest first. Declared after window_ and inflight_,
  // which hold the ops: it is destroyed (it owns nothing) before they are.
  OpLedger<Op> pending_;
  std::map<KeyClaim, KeyState> keys_;
  std::unordered_map<uint64_t, Window> windows_;  // by key id
  std::unordered_map<uint64_t, KeyClaim> key_requests_;
  uint64_t next_key_request_ = 1;
  std::deque<Control> control_out_;  // posted ahead of the queue
  std::vector<int> free_bufs_;
  uint64_t next_wr_id_ = 1;
};

}  // namespace rdmaflow::verbs
