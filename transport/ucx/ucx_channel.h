// UcxChannel: one UCP endpoint to one peer, keeping the channel contract.
//
// Two data paths (docs/ucx.md, "Data paths"), chosen per channel:
//  - rma: ucp_put_nbx / ucp_get_nbx with the peer's packed rkeys (true
//    one-sided where the transport supports RMA on registered memory, e.g.
//    InfiniBand/RoCE, TCP put). Small writes still travel as one AM.
//  - am: the write is an active message the receiver validates and places —
//    eager data is copied, rendezvous data is pulled by UCP straight into the
//    target (single copy, via CMA on shared memory). Reads are a request AM
//    answered with the bytes. Used where UCX 1.13 would only emulate RMA in
//    software (shared memory with existing, non-UCX-allocated memory).
//
// Ordering: active messages of the ordered kinds (message, write, notify, bye)
// carry a per-channel sequence number and are applied in that order by the
// receiver, whatever order UCX delivers them in. An ordered AM is not posted
// while puts issued before it are not known to be complete (ep flush), so a
// notify or message never overtakes the bytes of an earlier write.
//
// Defined in ucx_channel.cc (construction, the issuing threads' API, failure),
// ucx_send.cc (send queue, write/read paths, flushes, keys, notify ring
// publishing) and ucx_recv.cc (incoming messages in order, acknowledgements, key
// replies, read responses, our notify ring).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/handshake.h"
#include "transport/channel.h"
#include "transport/common/sticky_error.h"
#include "transport/shm/notify_ring.h"
#include "transport/shm/peer_memory.h"
#include "transport/ucx/ucx_core.h"

namespace rdmaflow::ucx {

class UcxChannel final : public Channel {
 public:
  enum class State : uint8_t { kConnecting, kOpen, kFailed };

  UcxChannel(std::shared_ptr<UcxCore> core, uint32_t id, int peer_rank,
             const ProcessIdentity& peer);
  ~UcxChannel() override;

  int peer_rank() const override { return peer_; }
  std::string backend() const override { return "ucx"; }
  ChannelCapabilities capabilities() const override { return {.any_source_memory = true}; }
  void write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
             std::optional<uint64_t> notify, Callback done, Millis timeout) override;
  void read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
            Millis timeout) override;
  void send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) override;
  // Direct channels: the owner confirms the key (a one-byte read the first
  // time), then the range is handed out inside this channel's mapping of the
  // peer's shared region.
  Result<DirectView> direct_view(const RemoteKey& key, uint64_t offset, size_t len,
                                 Millis timeout) override;
  void close() override;
  Status error() const override;

  // ---- progress context (the core's worker lock held) ----
  uint32_t id() const { return id_; }
  State state() const { return state_.load(std::memory_order_acquire); }
  bool failed() const { return !error_.ok(); }
  const ProcessIdentity& peer_identity() const { return peer_identity_; }
  void attach(ucp_ep_h ep, bool put_path, int pidfd);
  void set_remote_id(uint32_t remote) { remote_id_ = remote; }
  void opened();  // handshake done
  // The job handshake (common/handshake.h) over the hello messages. Acceptor: the
  // channel takes nothing but the connector's proof until it is checked, then
  // becomes acceptable. Connector: the challenge in the hello's answer is checked.
  void expect_proof(std::unique_ptr<auth::Acceptor> acceptor, std::string who);
  void answer_challenge_with(std::unique_ptr<auth::Connector> connector) {
    auth_connector_ = std::move(connector);
  }
  bool awaiting_proof() const { return auth_acceptor_ != nullptr; }
  Clock::time_point auth_since() const { return auth_since_; }
  // Fails an acceptor's channel whose connector did not prove the job secret.
  void refuse(const std::string& why);
  void enqueue(Op* op);
  void pump();        // posts queued ops until one must wait
  void flush_acks();  // sends the pending kAck, if any
  ucs_status_t on_am(const AmHeader& h, void* data, size_t length,
                     const ucp_am_recv_param_t* param);
  // Sticky: fails everything pending and closes the endpoint (FORCE; once
  // `linger_on`, close()'s goodbye, has been sent, or after a short while).
  void fail(const Status& st, Op* linger_on = nullptr);
  void close_locked(const Status& st);
  // The peer process exited (its pidfd became readable): fails the channel naming it.
  void peer_exited();
  void send_ctrl(MsgType type, uint64_t id, std::vector<uint8_t> data, uint16_t code = 0,
                 uint64_t value = 0, uint64_t length = 0);
  void post_ctrl(const AmHeader& h, std::vector<uint8_t> data);
  void revoked(uint64_t round, const std::vector<uint64_t>& key_ids);
  // Notify ring (shm/notify_ring.h), receiving side: delivers the entries that are next in
  // sequence; true if it delivered something or failed the channel.
  bool poll_ring();
  // Before a thread sleeps: true when the ring holds an entry poll_ring would take now.
  bool ring_deliverable() const;
  const std::shared_ptr<shm::NotifyRing>& rx_ring() const { return rx_ring_; }
  const std::shared_ptr<shm::NotifyRing>& tx_ring() const { return tx_ring_; }
  bool dirty = false;      // in the core's dirty list
  bool ack_held = false;   // in the core's held_acks_ list: flush_acks() waits
  bool peer_gone = false;  // the peer process died: its requests will never complete
  int64_t requests_inflight() const { return requests_inflight_; }

 private:
  struct KeyEntry {
    enum class State : uint8_t { kQuerying, kValid, kRefused } state = State::kQuerying;
    KeySecret secret;
    uint64_t addr = 0;
    uint64_t length = 0;
    std::vector<uint8_t> blob;
    ucp_rkey_h rkey = nullptr;
    Status refusal;
    uint64_t region = 0;  // direct channels: the owner's region (key of maps_), 0 = none
  };
  // A same-host peer's shared region, mapped here (direct channels).
  struct Mapping {
    shm::PeerMemory memory;    // munmaps when the last user (views included) lets go
    uint64_t remote_base = 0;  // the region's address in the peer
    int refs = 0;              // keys_ entries using it
  };
  struct RxItem {
    UcxChannel* ch = nullptr;
    MsgType type = MsgType::kMessage;
    bool ready = true;
    bool orphan = false;  // the channel failed while its rendezvous data was in flight
    bool has_notify = false;
    uint64_t seq = 0;
    uint64_t notify = 0;
    uint16_t code = 0;  // refusal
    std::string reason;
    std::vector<uint8_t> bytes;
  };
  struct FlushCtx {
    UcxChannel* ch = nullptr;
    std::vector<Op*> ops;
    std::vector<ucp_rkey_h> rkeys;
  };
  enum class Step : uint8_t { kPosted, kStall };

  // ucx_channel.cc
  Op* issue(OpKind kind, Callback done, Millis timeout);
  Status check_key(const RemoteKey& key, uint64_t offset, uint64_t len, const char* op) const;
  void protocol_error(const std::string& what);
  Status ucs_error(const char* op, ucs_status_t status) const;

  // ucx_send.cc
  Step post(Op* op);
  Step post_write(Op* op);
  Step post_read(Op* op);
  bool ordered_ready();  // no earlier put still unflushed (issues the flush if needed)
  void issue_flush();
  void on_flush_done(FlushCtx* ctx, ucs_status_t status);
  // Sends op->hdr + data as an AM; counts a part and a reference for the send.
  bool post_am(Op* op, const void* data, size_t len, uint32_t am_flags);
  KeyEntry* resolve_key(Op* op, Status* refusal);
  void query_key(KeyEntry& e, const Op* op);
  // The peer's shared pages holding [key_addr + offset, + len) of a direct key,
  // and in *at where the range starts in them; null if the range is not shared.
  const shm::PeerMemory* direct_memory(const KeyEntry& e, const Op* op, uint64_t* at) const;
  // Publishes op's notify in the peer's ring (after its bytes were copied); false
  // when the ring is full, which leaves the notify to the ordered kNotify AM.
  bool publish_ring(Op* op);
  // The direct path's copy of op's bytes into (`to_peer`) or out of `memory` at
  // `at`: shm::PeerMemory's put / get, in slices with a look at the peer's pidfd
  // between them. False when it completed op with a failure (the channel failed
  // once the peer is found dead).
  bool copy_direct(Op* op, const shm::PeerMemory& memory, uint64_t at, bool to_peer);
  static void on_send(void* request, ucs_status_t status, void* user);
  static void on_flush(void* request, ucs_status_t status, void* user);

  // ucx_recv.cc
  void on_ack(const AmHeader& h, const void* data, size_t length);
  void on_key_reply(const AmHeader& h, const void* data, size_t length);
  // Maps the peer's region described by `info` (or takes another reference); false if not.
  bool map_region(const DirectInfo& info);
  void unref_region(uint64_t region);
  ucs_status_t on_ordered(const AmHeader& h, void* data, size_t length,
                          const ucp_am_recv_param_t* param);
  ucs_status_t on_read_req(const AmHeader& h);
  ucs_status_t on_read_resp(const AmHeader& h, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
  void deliver(RxItem& item);
  void deliver_ready();
  void ring_error(const std::string& what);
  // Fails the channel: the peer presented a wrong secret for a live grant.
  ucs_status_t forged_key(const Status& why);
  static void on_rx_data(void* request, ucs_status_t status, size_t length, void* user);
  static void on_read_data(void* request, ucs_status_t status, size_t length, void* user);

  const std::shared_ptr<UcxCore> core_;
  const uint32_t id_;
  const int peer_;
  const ProcessIdentity peer_identity_;
  std::atomic<State> state_{State::kConnecting};
  std::unique_ptr<auth::Acceptor> auth_acceptor_;    // until the connector's proof is checked
  std::unique_ptr<auth::Connector> auth_connector_;  // until the acceptor's challenge is
  std::string auth_peer_;                            // "a UCX peer claiming rank N"
  Clock::time_point auth_since_;

  StickyError error_;  // set by fail(), in progress context; read anywhere

  // Issuing threads: keys this channel has already been given the blob of.
  std::mutex known_mu_;
  std::unordered_set<uint64_t> known_keys_;

  // Progress context.
  ucp_ep_h ep_ = nullptr;
  bool put_path_ = false;
  // Same-host peer on the am path: registered memory of the peer is reached by memcpy
  // through a shared mapping when its region has one (docs/ucx.md, "Data paths").
  bool direct_ = false;
  std::unordered_map<uint64_t, Mapping> maps_;  // by the owner's region id
  uint64_t am_writes_inflight_ = 0;             // direct channels: kWrite AMs not yet acknowledged
  // Notify rings: ours, which the peer publishes into (created when the peer first
  // asks for a key), and the peer's, which we publish into (mapped from its key reply).
  std::shared_ptr<shm::NotifyRing> rx_ring_;
  uint64_t rx_head_ = 0;  // our own copy; the shared head is only ever written from it
  bool rx_ring_tried_ = false;
  std::shared_ptr<shm::NotifyRing> tx_ring_;
  uint64_t tx_tail_ = 0;
  bool tx_ring_tried_ = false;
  int pidfd_ = -1;
  // A dead peer's shared pages stay mapped here, so a direct copy into (or out of)
  // them would still "succeed". copy_direct() looks at the pidfd every
  // kLivenessBytes copied; this counts the bytes since the last look.
  size_t copied_since_check_ = 0;
  uint32_t remote_id_ = 0;
  Op* q_head_ = nullptr;
  Op* q_tail_ = nullptr;
  uint64_t tx_seq_ = 0;
  std::deque<Op*> awaiting_ack_;
  std::unordered_map<uint64_t, Op*> reads_;
  std::unordered_map<uint64_t, KeyEntry> keys_;
  uint64_t unflushed_ = 0;    // puts posted since the last flush was issued
  bool force_flush_ = false;  // a revocation waits for every earlier put/get
  FlushCtx* flush_ = nullptr;
  std::vector<Op*> flush_waiters_;         // puts that complete with the next flush
  std::vector<ucp_rkey_h> retired_rkeys_;  // destroyed once the next flush completes
  uint64_t rx_next_ = 0;
  std::map<uint64_t, RxItem*> rx_held_;
  uint64_t ack_from_ = 0;
  bool ack_needed_ = false;
  std::vector<uint8_t> ack_refusals_;
  int64_t requests_inflight_ = 0;  // our UCP requests on this channel not yet completed

  void note_request() {
    core_->note_request();
    ++requests_inflight_;
  }

  friend class UcxCore;
  friend std::shared_ptr<shm::NotifyRing> notify_ring_for_testing(Channel& channel);
  friend bool skip_sequence_numbers_for_testing(Channel& channel, uint64_t n);
};

// Test hook: the notify ring `channel` (a UCX channel) publishes into, or null when
// it has none (not a direct channel, ring off, or no key resolved yet). Lets a test
// play a misbehaving peer by writing into the shared ring.
std::shared_ptr<shm::NotifyRing> notify_ring_for_testing(Channel& channel);

// Test hook: the next `n` sequence numbers of `channel` (a UCX channel; false if
// not) are never sent, as a hostile or broken peer would leave them out, so the
// receiver holds back everything after them (RDMAFLOW_MAX_PEER_QUEUED bounds it).
bool skip_sequence_numbers_for_testing(Channel& channel, uint64_t n);

}  // namespace rdmaflow::ucx
