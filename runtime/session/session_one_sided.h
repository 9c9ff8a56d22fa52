// OneSidedEngine: the Session over a Channel mesh (tcp, ucx, verbs).
//
// Per transfer and step, one Channel::write with notify make_notify(t, step)
// from the sender's output buffer into the receiver's slot. Per peer and step,
// one credit: an 8-byte write with notify make_notify(kCreditTransfer, step)
// into a word the sender exported for that receiver.
//
// Peers may use different transports (runtime/selection/transport_select.h): the arena
// is registered with every transport in use, and each key is exported through
// the transport of the peer that will use it. A large dynamic output read by
// peers of several transports carries one key per transport in its header.
//
// State lives in a shared Core so that completion callbacks, which run on the
// transport's thread, never outlive it. Lock order: Core::mu is never held
// while calling into a channel or an inbox.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "allocator/arena.h"
#include "runtime/session/session_engine.h"

namespace rdmaflow::session_detail {

// Bytes per peer in the control region: a credit word (mailbox), and after all
// peers' words, a credit source per peer (each on its own cache line).
inline constexpr size_t kCtrlStride = 64;

// The notify transfer id credits use (plan transfer ids are dense from 0).
inline constexpr graph::TransferId kCreditTransfer = 0xffffffffu;

class OneSidedEngine final : public Session::Engine {
 public:
  // `transports`: per peer rank (null for this rank and for peers without a channel).
  OneSidedEngine(std::vector<Transport*> transports, ChannelMesh channels, int rank, int world);
  ~OneSidedEngine() override;

  std::string name() const override;
  Status setup(const SessionLayout& layout, const AllGather& allgather, Millis timeout) override;
  uint8_t* frames() override { return frames_; }
  Result<SessionBuffer> overflow_buffer(size_t output_index, uint64_t step, size_t bytes) override;
  Status begin_step(uint64_t step) override;
  Status send(graph::TransferId t, uint64_t step, const void* payload, size_t bytes,
              const std::vector<int64_t>& dims) override;
  Result<RecvView> recv(graph::TransferId t, uint64_t step) override;
  Status end_step(uint64_t step) override;
  Status finish(const AllGather& allgather) override;
  void add_stats(SessionStats& stats) const override;

 private:
  enum class SlotState : uint8_t { kEmpty, kReading, kReady, kFailed };
  struct InSlot {
    int64_t step = -1;
    SlotState state = SlotState::kEmpty;
    Status error;
    RecvView view;
    std::optional<Allocation> overflow;  // a large dynamic payload is read here
  };
  struct InTransfer {
    graph::TransferId id = 0;
    int peer = 0;
    uint64_t next_arrival = 0;
    std::vector<InSlot> slots;  // per frame
  };
  struct OutTransfer {
    graph::TransferId id = 0;
    int peer = 0;
    size_t output_index = 0;
    std::vector<RemoteKey> slot_keys;  // per frame
  };
  struct OutOverflow {  // a dynamic output larger than planned, per (output, frame)
    std::optional<Allocation> alloc;
    std::vector<std::pair<Transport*, RemoteKey>> keys;  // one per transport of its readers
  };
  struct Pending {  // an operation on a frame, for begin_step's timeout message
    graph::TransferId transfer = 0;
    int peer = 0;
    const char* what = "";
  };
  struct Peer {
    std::shared_ptr<Channel> channel;
    std::optional<RemoteKey> credit_key;  // where this rank writes its credits (peer sends to us)
    int64_t credited = -1;                // the peer finished every step <= credited
    Status error;                         // sticky
  };
  struct Core {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t events = 0;  // bumped on every notify, completion and failure
    bool stop = false;
    // The session's progress thread sleeps on its own condition variable and
    // is woken only while no user thread waits: a waiting thread pumps and
    // credits itself, and waking a third thread per event on a busy machine
    // costs every waiter a share of the cores.
    std::condition_variable progress_cv;
    int waiting = 0;        // user threads inside wait()
    uint64_t arrivals = 0;  // notifies queued on the inboxes (the listeners count them)
    uint64_t pumped = 0;    // every arrival up to this one was taken by a pump
    std::vector<Peer> peers;
    std::map<graph::TransferId, InTransfer> in;
    std::vector<std::vector<Pending>> pending;  // per frame
    size_t credits_in_flight = 0;
    std::optional<uint64_t> first_step;
    std::optional<uint64_t> last_ended;
    uint64_t next_credit = 0;  // the next ended step to credit (valid once first_step is set)
    SessionStats stats;
    void bump() {
      ++events;
      cv.notify_all();
      if (waiting == 0 || stop) progress_cv.notify_one();
    }
  };
  using Lock = std::unique_lock<std::mutex>;
  using Deadline = std::chrono::steady_clock::time_point;

  // Takes every notify queued on every inbox and applies it; issues the reads
  // large dynamic tensors need. Any thread, Core::mu not held.
  void pump();
  // Applies one notify from `peer`; appends reads to issue. Core::mu held.
  struct ReadAction {
    graph::TransferId t;
    uint64_t step;
    int peer;
    void* dst;
    size_t bytes;
    RemoteKey key;
  };
  void apply_notify(int peer, uint64_t value, std::vector<ReadAction>& reads);
  void issue_reads(std::vector<ReadAction>& reads);
  // Sends the credits of every ended step whose frame is idle, in step order.
  void send_due_credits();
  // Records channel failures as sticky peer errors. Core::mu held.
  void note_channel_errors();
  // Waits (pumping) until `ready` holds under Core::mu, the deadline passes or
  // a failure of `peer` is known; returns the lock held.
  template <typename Pred>
  bool wait(Lock& lock, Deadline deadline, int peer, Pred ready);
  // Waits until `peer` has released step `need` (its credit), counting the
  // stall and its time when it had not yet. Core::mu held; false on timeout
  // or a failure of `peer`.
  bool wait_for_credit(Lock& lock, int peer, int64_t need);
  void progress_loop();
  Callback op_callback(uint32_t frame, Pending who, uint64_t bytes_on_success);
  uint8_t* slot_ptr(graph::TransferId t, uint32_t frame) const;
  uint8_t* send_ptr(graph::TransferId t, uint32_t frame) const;

  Transport* transport_for(int peer) const;
  void revoke(OutOverflow& o);

  std::vector<Transport*> transports_;  // per peer
  std::vector<Transport*> distinct_;    // each transport in use once, in peer order
  int rank_;
  int world_;
  const SessionLayout* layout_ = nullptr;
  Millis timeout_{30000};
  std::unique_ptr<RegisteredArena> arena_;
  std::vector<Transport*> attached_;
  Allocation frame_alloc_;
  Allocation ctrl_alloc_;  // per peer: a 64-byte credit word (mailbox), then a credit source
  uint8_t* frames_ = nullptr;
  std::map<graph::TransferId, OutTransfer> out_;
  std::map<std::pair<size_t, uint32_t>, OutOverflow> out_overflow_;
  std::vector<int64_t> header_step_;  // per output buffer and frame: step whose header is written
  std::mutex credit_mu_;              // serializes send_due_credits
  std::shared_ptr<Core> core_ = std::make_shared<Core>();
  std::thread progress_;
};

}  // namespace rdmaflow::session_detail
