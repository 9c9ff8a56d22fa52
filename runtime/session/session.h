// Session: runs a TransferPlan step after step (docs/session.md).
//
// Setup (collective, once): every rank checks that all ranks hold the same
// plan (plan_hash) and all use the gRPC baseline or none, allocates the plan's
// frames (receive slots and output buffers) in a RegisteredArena attached to
// every transport its peers use, and hands each sender the RemoteKeys of its
// slots (exported through that sender's transport). After that a
// step of a static transfer is one one-sided write with notify
// make_notify(transfer, step): no RPC, no metadata, no copy.
//
//   auto session = Session::create(plan, *boot);            // collective
//   for (uint64_t s = 0; s < steps; ++s) {
//     session->begin_step(s);
//     auto buf = session->output_buffer("h1", s, bytes);     // producer writes here
//     ...                                                    // (the allocation hook)
//     session->send(t_h1, s);                                // the Send op
//     auto view = session->recv(t_g1, s);                    // the Recv op: a view of the slot
//     ...
//     session->end_step(s);                                  // releases the step's slots
//   }
//   session->finish();                                       // collective
//
// Flow control: a slot is never overwritten before its receiver released it.
// Step s uses frame s mod copies on every rank; a sender writes step s to a
// peer only after that peer has finished step s - copies (a credit: an 8-byte
// write with notify from the receiver, sent once the step ended and every
// operation that touched the frame completed).
//
// Dynamic tensors (unknown dimensions) take the metadata-then-read path: the
// sender writes a header (dtype, shape, bytes) into the slot; when the payload
// fits the planned size it follows in the same write, otherwise the header
// carries a RemoteKey and the receiver reads the payload into memory it
// allocates from its arena.
//
// Transports: RDMAFLOW_TRANSPORT = auto (default: chosen per peer, see
// runtime/selection/transport_select.h: verbs where a device reaches the peer, else UCX
// over shared memory or RDMA, else TCP), tcp, ucx, verbs, or grpc (the
// TensorFlow-style baseline: Send publishes, Recv is a RecvTensor pull; same
// plan, same API).
//
// Thread model: the step methods (begin_step ... end_step, finish) are called
// by one executor thread. Progress (notifications, credits, dynamic reads) runs
// on a session thread; a waiting executor thread also makes progress itself so
// a notify reaches it without an extra hop. Every wait has a deadline
// (RDMAFLOW_TIMEOUT_MS) and its error names the transfer, the tensor, the step
// and the peer rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "graph/transfer_plan.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow {

namespace session_detail {
struct SessionLayout;
}

struct SessionOptions {
  // "auto", "tcp", "ucx", "verbs" or "grpc". Empty: RDMAFLOW_TRANSPORT, else "auto".
  std::string transport;
  // Deadline of every wait. Unset: RDMAFLOW_TIMEOUT_MS (default 30000 ms).
  std::optional<Millis> timeout;
};

// AllGather (runtime/selection/transport_select.h) is the collective exchange used at
// setup and in finish(): every rank's bytes, by rank.

// What a session needs when the caller already built the channels.
struct SessionPeers {
  int rank = 0;
  int world_size = 1;
  Transport* transport = nullptr;  // must outlive the session; null for a single rank
  // Or one transport per peer (world entries, null for this rank) when peers use
  // different ones (TransportSelection::per_peer()); takes precedence when set.
  std::vector<Transport*> transports;
  ChannelMesh channels;  // by peer rank; null for this rank
  AllGather allgather;
};

// A registered buffer the plan placed, for one step.
struct SessionBuffer {
  void* data = nullptr;
  size_t capacity = 0;
};

// A received tensor: a view of the receive slot (or, for a dynamic tensor larger
// than its planned size, of the memory the payload was read into). Valid until
// end_step of its step.
struct RecvView {
  const void* data = nullptr;
  size_t bytes = 0;
  DataType dtype = DataType::kF32;
  std::vector<int64_t> dims;
};

// What the executor hands to send() when the producer did not write into the
// planned buffer, or when the tensor is dynamic (its dims are only known now).
struct SendSource {
  const void* data = nullptr;  // null: the tensor is already in output_buffer()
  size_t bytes = 0;
  std::vector<int64_t> dims;  // dynamic tensors: the actual dims
};

struct SessionStats {
  uint64_t steps = 0;
  uint64_t bytes_sent = 0;  // payload bytes of the transfers this rank sent
  uint64_t bytes_received = 0;
  uint64_t writes = 0;          // one-sided data writes (static and dynamic)
  uint64_t reads = 0;           // dynamic payload reads
  uint64_t staging_copies = 0;  // sends whose producer did not use output_buffer()
  uint64_t credits_sent = 0;
  uint64_t credit_stalls = 0;  // sends (and output buffers) that had to wait for a credit
  double recv_wait_ms = 0;     // executor time spent waiting in recv()
  double credit_wait_ms = 0;   // executor time spent waiting for a peer's credit
};

class Session {
 public:
  // Chooses a transport per peer (SessionOptions::transport, see
  // runtime/selection/transport_select.h), builds the channel mesh through `boot` and sets
  // up the plan. Collective.
  static Result<std::unique_ptr<Session>> create(const graph::TransferPlan& plan, Bootstrap& boot,
                                                 SessionOptions options = {});

  // Sets up the plan over channels the caller built (one-sided transports only).
  // Collective.
  static Result<std::unique_ptr<Session>> create(const graph::TransferPlan& plan,
                                                 SessionPeers peers, SessionOptions options = {});

  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const;
  int world_size() const;
  // "ucx", "tcp", ...; "ucx+tcp" when peers use different transports; "local"
  // for a single rank; "grpc" for the baseline.
  const std::string& transport_name() const;
  // Per peer rank: the transport of its channel and why it was chosen. Empty
  // when the caller built the channels (SessionPeers) or for gRPC.
  const std::vector<PeerTransport>& peer_transports() const;
  const graph::TransferPlan& plan() const;
  const graph::RankPlan& rank_plan() const;
  Millis timeout() const;

  // Starts step `step` (the first call may use any step; then each step is the
  // previous one plus 1). Waits until this rank's frame for the step is free:
  // the writes and reads of step - copies completed.
  Status begin_step(uint64_t step);

  // The allocation hook: the registered buffer the plan assigned to `tensor`
  // (an output of an op on this rank that is sent to other ranks) for `step`,
  // with room for `bytes`; nullopt when the plan placed no buffer for it (the
  // executor allocates as usual). For a dynamic tensor larger than its planned
  // size, a registered buffer big enough is returned instead.
  Result<std::optional<SessionBuffer>> output_buffer(const std::string& tensor, uint64_t step,
                                                     size_t bytes);

  // The Send op of transfer `t` for `step`: starts the write (returns without
  // waiting for it; begin_step of step + copies does). Waits, at most the
  // timeout, for the receiver's credit for step - copies.
  Status send(graph::TransferId t, uint64_t step, const SendSource& source = {});
  // Same, naming the transfer by tensor and destination rank.
  Status send(const std::string& tensor, int dst_rank, uint64_t step,
              const SendSource& source = {});

  // The Recv op of transfer `t` for `step`: waits for the notify (and, for a
  // large dynamic tensor, the read) and returns a zero-copy view.
  Result<RecvView> recv(graph::TransferId t, uint64_t step);
  Result<RecvView> recv(const std::string& tensor, int src_rank, uint64_t step);

  // Marks the step's received tensors as consumed. Once every operation on the
  // step's frame completed, the senders get their credit.
  Status end_step(uint64_t step);

  // Waits until every write, read and credit this rank started completed, then
  // meets every other rank (collective) so nobody tears channels down while a
  // peer still writes. Idempotent; later step calls fail.
  Status finish();

  SessionStats stats() const;

  // The transfer of `tensor` from `src` to `dst`, if the plan has one.
  std::optional<graph::TransferId> find_transfer(const std::string& tensor, int src, int dst) const;

  class Engine;  // one per transport family (runtime/session/session_engine.h)

 private:
  Session();
  static Result<std::unique_ptr<Session>> setup(const graph::TransferPlan& plan, int rank,
                                                int world, std::unique_ptr<Engine> engine,
                                                const AllGather& allgather, Millis timeout);
  Status check_step(uint64_t step, const char* op) const;
  Result<const graph::TransferSpec*> transfer_spec(graph::TransferId t, bool outgoing,
                                                   const char* op) const;

  std::shared_ptr<const graph::TransferPlan> plan_;
  std::unique_ptr<session_detail::SessionLayout> layout_;
  uint64_t staging_copies_ = 0;
  int rank_ = 0;
  int world_ = 1;
  Millis timeout_{30000};
  std::string transport_name_;
  std::optional<uint64_t> step_;  // the step between begin_step and end_step
  std::optional<uint64_t> last_step_;
  int64_t step_began_ns_ = 0;  // the trace's step span (common/trace.h), when tracing
  // Schedule-order check of send(): by transfer id, 1 + the step of its last
  // completed recv (0: none), and how many of layout_->recv_order completed in
  // the current step.
  std::vector<uint64_t> received_step_;
  size_t recvs_done_ = 0;
  bool finished_ = false;
  std::unique_ptr<Engine> engine_;
  // Owned when create(plan, boot) built them. Destroyed after the engine.
  std::unique_ptr<TransportSelection> selection_;
  std::vector<PeerTransport> peer_transports_;
  AllGather allgather_;
};

// One transport for the whole job, for users that need a single one: the one
// RDMAFLOW_TRANSPORT (or `requested`) names, resolved on every rank ("auto"
// becomes the highest-priority backend that every rank can create; "grpc" is
// returned as is). Collective. Session::create chooses per peer instead
// (select_transports).
Result<std::string> choose_transport(const std::string& requested, const TransportConfig& config,
                                     const AllGather& allgather);

}  // namespace rdmaflow
