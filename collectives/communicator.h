// Communicator: collectives over the channels the bootstrap built.
//
//   CommunicatorSetup s{rank, world, channels /* null for self */, &transport};
//   auto comm = Communicator::create(s);
//   (*comm)->allreduce(in, out, n, DataType::kF32, ReduceOp::kSum);      // blocking
//   Request r = (*comm)->start_allreduce(in, out, n, DataType::kF32, ReduceOp::kSum);
//   ... r.test() ... r.wait(Millis(100)) ...
//
// Semantics follow NCCL: every rank calls the same collectives in the same
// order with the same counts, types, reductions and roots. In place is
// `in == out` (allgather: in == out + rank * count; reduce_scatter:
// out == in + rank * count). Every call has a timeout (CallOptions::timeout,
// default RDMAFLOW_TIMEOUT_MS) that is about progress, not total time: a call
// fails once it went that long without a piece moving (so a large collective
// on a slow link is not cut short while its bytes flow), or at once when any
// peer's channel failed (a dead rank), or when abort() is called; errors name
// the collective, the algorithm and the peer ("allreduce[ring] (peer rank 3)
// failed: timeout: ...").
//
// Several collectives may be in flight at once: each runs on a lane
// (tag % lanes, the tag defaulting to the call's sequence number), lanes have
// separate scratch slots and sequence numbers, so they never mix. Calls on the
// same lane run in call order. Issue calls from one thread, or give explicit
// tags when several threads issue them.
//
// Memory: data always moves by one-sided writes with notify into registered
// scratch slots taken once at creation (or, to a same-host peer whose memory
// the channel maps, by memcpy into those slots and a sequence word: the
// fabric's direct path); user buffers are never registered per call. The TCP and UCX backends read
// the source straight from user memory; for backends that need a registered source (verbs) pieces
// are staged through registered memory first, unless they lie in a buffer of
// allocate_registered().
//
// After an error the communicator is broken (its lanes' sequence numbers no
// longer agree with the peers'); later calls fail at once with that error.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "collectives/codecs/codec.h"
#include "collectives/cost_model.h"
#include "collectives/fabric.h"
#include "collectives/topology.h"
#include "collectives/tuner.h"
#include "collectives/types.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow {

struct CommunicatorSetup {
  int rank = 0;
  int world = 1;
  // world entries, indexed by peer rank; null for this rank.
  std::vector<std::shared_ptr<Channel>> channels;
  // The transport the channels belong to (registers the scratch memory), or
  // one per peer in `transports` (world entries) when peers use different ones.
  Transport* transport = nullptr;
  std::vector<Transport*> transports;
};

struct CommunicatorOptions {
  size_t slot_bytes = 0;          // 0: RDMAFLOW_COLL_SLOT_BYTES, default 512 KiB
  int slots = 0;                  // per peer per lane; 0: RDMAFLOW_COLL_SLOTS, default 4
  int lanes = 0;                  // 0: RDMAFLOW_COLL_LANES, default 2
  int spin_us = -1;               // -1: RDMAFLOW_COLL_SPIN_US, default 10000
  size_t piece_bytes = 0;         // 0: chosen per call (<= slot_bytes)
  bool measure = true;            // measure alpha/beta at creation (else defaults)
  std::optional<bool> direct;     // same-host direct path; default RDMAFLOW_COLL_DIRECT (1)
  std::optional<Millis> timeout;  // default RDMAFLOW_TIMEOUT_MS
  // Ranks with equal keys are one host (host_groups()); default this_host_key()
  // (topology.h). Tests set it to simulate hosts on one machine; which path
  // a pair's bytes take still follows its channel.
  std::optional<uint64_t> host_key;
  // Point-to-point send()/recv(): one more fabric lane, theirs alone (its
  // slots cost lanes+1/lanes of the scratch memory), so they never mix with
  // the collectives' lanes. Every rank must set it alike.
  bool p2p = false;
};

// alltoallv's layout, in elements, world entries each: rank r's block for
// peer p is in[send_displs[p], + send_counts[p]) and p's block lands in
// out[recv_displs[p], + recv_counts[p]). send_counts[p] on rank r must equal
// recv_counts[r] on rank p: alltoallv checks it before moving any data.
struct AlltoallvLayout {
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
};

struct CallOptions {
  Algorithm algorithm = Algorithm::kAuto;  // kAuto: RDMAFLOW_<OP>_ALGO, else the cost model
  std::optional<uint64_t> tag;             // picks the lane; default: call sequence number
  std::optional<Millis> timeout;           // the longest the call may go without progress
  // Gradient codec for f32 allreduce, reduce_scatter and allgather
  // (collectives/codecs/codec.h, docs/compression.md). Default: RDMAFLOW_CODEC,
  // which applies to f32 sum/avg allreduce only; CodecSpec{} forces none.
  std::optional<CodecSpec> codec;
  // The caller's error feedback for this tensor (one state per tensor, see
  // CodecState); null: none.
  CodecState* codec_state = nullptr;
};

class Program;

namespace detail {
struct OpState;
}

// Handle of an asynchronous collective.
class Request {
 public:
  Request() = default;
  bool valid() const { return state_ != nullptr; }
  // True once the collective finished (successfully or not).
  bool test() const;
  // Waits up to `timeout` (default: until the collective ends, which it does
  // by itself: done, failed, or timed out for want of progress). A
  // kTimeout from here means "not finished yet": the collective goes on and
  // wait() may be called again.
  Status wait(std::optional<Millis> timeout = std::nullopt);
  Algorithm algorithm() const;
  CollectiveKind kind() const;

 private:
  friend class Communicator;
  explicit Request(std::shared_ptr<detail::OpState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::OpState> state_;
};

class Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> create(CommunicatorSetup setup,
                                                      CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const CostModel& cost_model() const { return model_; }
  // Which ranks share a host, learnt at creation from every rank's host key
  // (an allgather over the channels, whatever path they take).
  const HostGroups& host_groups() const { return hosts_; }
  const FabricConfig& config() const { return fabric_->config(); }
  // Counters of the fabric: peers on the same-host direct path, pieces sent
  // each way, doorbell sleeps.
  FabricStats stats() const;
  // `bytes` of zeroed memory registered with every transport of the peers
  // (collectives/user_memory.h): sends from it to a peer whose backend needs
  // a registered source skip the staging copy. It may outlive the
  // communicator (then it is plain memory).
  Result<std::shared_ptr<RegisteredBuffer>> allocate_registered(size_t bytes);
  size_t registered_buffers() const;  // allocate_registered()'s buffers alive

  // Fails every running and queued collective at once with kCancelled naming
  // `reason`, as ncclCommAbort does, and breaks the communicator (later calls
  // fail at once). Callable from any thread, e.g. a watchdog or a signal
  // handler's helper thread; waiters are woken, a rank driving a channel sees
  // it within a few milliseconds. Peers are not told: their calls fail as
  // this rank's channels stop answering, or when they are aborted too.
  void abort(const std::string& reason = "");

  // The algorithm a call would use (forced, from the environment, the
  // tuner's once it settled the call's size, or the model's).
  Result<Algorithm> select(CollectiveKind kind, size_t count, DataType type,
                           const CallOptions& options = {}) const;
  // What the tuner (RDMAFLOW_COLL_TUNE, collectives/tuner.h) settled on for
  // calls like this one; empty while it still times candidates, or when off.
  std::optional<Tuner::Outcome> tuned(CollectiveKind kind, size_t count, DataType type) const;
  // Whether calls like this one are tuned (the tuner on, and the call at
  // least RDMAFLOW_COLL_TUNE_MIN_BYTES).
  bool tuning(CollectiveKind kind, size_t count, DataType type) const;

  // ---- blocking ----
  Status allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                   const CallOptions& options = {});
  Status reduce_scatter(const void* in, void* out, size_t recv_count, DataType type, ReduceOp op,
                        const CallOptions& options = {});
  Status allgather(const void* in, void* out, size_t send_count, DataType type,
                   const CallOptions& options = {});
  Status broadcast(const void* in, void* out, size_t count, DataType type, int root,
                   const CallOptions& options = {});
  Status reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root,
                const CallOptions& options = {});
  Status barrier(const CallOptions& options = {});
  Status alltoall(const void* in, void* out, size_t count, DataType type,
                  const CallOptions& options = {});
  // Uneven alltoall (communicator_v.cc): `in` holds in_elems, `out` out_elems
  // elements; the blocks must lie inside them, the received blocks must not
  // overlap, and in and out must not overlap. Each pair first exchanges its
  // counts (one round of 16-byte messages): a pair that disagrees moves none
  // of its blocks and fails the call on both its ranks with kInvalidArgument
  // naming the peer (the other pairs' blocks arrive); the communicator stays usable.
  Status alltoallv(const void* in, size_t in_elems, void* out, size_t out_elems,
                   const AlltoallvLayout& layout, DataType type, const CallOptions& options = {});
  // Point to point (communicator_v.cc; needs CommunicatorOptions::p2p): the
  // messages of a pair are matched in the order they were posted, each
  // direction on its own queue, so a send and a recv with the same peer run at
  // once. A message up to slots x slot_bytes is written into the receiver's
  // registered slots without waiting for its recv; a longer one waits for it.
  // recv checks the message's size and tag against its own: a mismatch fails
  // it with kInvalidArgument (the message is consumed, the pair stays usable).
  Status send(const void* buf, size_t count, DataType type, int peer, uint64_t tag = 0,
              const CallOptions& options = {});
  Status recv(void* buf, size_t count, DataType type, int peer, uint64_t tag = 0,
              const CallOptions& options = {});

  // ---- asynchronous ----
  Request start_allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                          const CallOptions& options = {});
  Request start_reduce_scatter(const void* in, void* out, size_t recv_count, DataType type,
                               ReduceOp op, const CallOptions& options = {});
  Request start_allgather(const void* in, void* out, size_t send_count, DataType type,
                          const CallOptions& options = {});
  Request start_broadcast(const void* in, void* out, size_t count, DataType type, int root,
                          const CallOptions& options = {});
  Request start_reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                       int root, const CallOptions& options = {});
  Request start_barrier(const CallOptions& options = {});
  Request start_alltoall(const void* in, void* out, size_t count, DataType type,
                         const CallOptions& options = {});
  Request start_alltoallv(const void* in, size_t in_elems, void* out, size_t out_elems,
                          const AlltoallvLayout& layout, DataType type,
                          const CallOptions& options = {});
  Request start_send(const void* buf, size_t count, DataType type, int peer, uint64_t tag = 0,
                     const CallOptions& options = {});
  Request start_recv(void* buf, size_t count, DataType type, int peer, uint64_t tag = 0,
                     const CallOptions& options = {});

  // Any collective by kind (count as in the per-kind calls; root and op where
  // they apply).
  Request start(CollectiveKind kind, const void* in, void* out, size_t count, DataType type,
                ReduceOp op, int root, const CallOptions& options = {});
  Status run(CollectiveKind kind, const void* in, void* out, size_t count, DataType type,
             ReduceOp op, int root, const CallOptions& options = {});

 private:
  struct Call;
  struct Lane;
  struct P2pQueue;
  Communicator() = default;
  // Checks the arguments and fills `call` (a blocking call's lives on the stack).
  Status prepare(Call& call, CollectiveKind kind, const void* in, void* out, size_t count,
                 DataType type, ReduceOp op, int root, const CallOptions& options);
  Status prepare_codec(Call& call, const CallOptions& options, uint64_t seq);
  Status execute_call(Call& call, Lane& lane);
  // execute_call, timed for the tuner when the call is one of its trials.
  Status execute_timed(Call& call, Lane& lane);
  // The tuner's pick for an automatic call (Tuner::pick; empty pick: not tuned).
  Result<Tuner::Pick> tune(CollectiveKind kind, size_t bytes, DataType type, ReduceOp op,
                           const CallOptions& options);
  // Runs a prepared call on its lane: on this thread (blocking) or on the
  // lane's worker (start).
  Status run_prepared(Call& call);
  Request enqueue(std::shared_ptr<Call> call);
  // Runs `program` on `lane`; a failure breaks the communicator.
  Status execute_program(const Program& program, int lane, const std::string& what,
                         std::chrono::steady_clock::time_point deadline);
  Result<std::shared_ptr<Call>> prepare_alltoallv(const void* in, size_t in_elems, void* out,
                                                  size_t out_elems, const AlltoallvLayout& layout,
                                                  DataType type, const CallOptions& options);
  Request start_p2p(bool sending, void* buf, size_t count, DataType type, int peer, uint64_t tag,
                    const CallOptions& options);
  void stop_p2p();
  // A Request that is already finished with `st`.
  static Request finished(CollectiveKind kind, Status st);
  Status find_hosts(uint64_t key);
  Status measure();
  void worker_loop(Lane* lane);

  int rank_ = 0;
  int world_ = 1;
  CommunicatorOptions options_;
  std::unique_ptr<Fabric> fabric_;
  HostGroups hosts_;
  CostModel model_;
  std::vector<std::optional<Algorithm>> env_algo_;    // per CollectiveKind
  CodecSpec env_codec_;                               // RDMAFLOW_CODEC
  std::shared_ptr<const Codec> env_codec_made_;       // ... made once
  mutable std::atomic<uint64_t> algo_memo_[16] = {};  // per CollectiveKind, see select()
  std::unique_ptr<Tuner> tuner_;                      // null: RDMAFLOW_COLL_TUNE=0, one rank
  std::vector<std::unique_ptr<Lane>> lanes_;
  // Per peer, [2 * peer] its sends, [2 * peer + 1] its receives (p2p only).
  std::vector<std::unique_ptr<P2pQueue>> p2p_;
  std::atomic<uint64_t> calls_{0};
  mutable std::mutex broken_mu_;
  Status broken_;
  std::atomic<bool> is_broken_{false};  // broken_ is set (checked without the mutex)
};

}  // namespace rdmaflow
