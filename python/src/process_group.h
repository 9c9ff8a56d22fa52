// ProcessGroupRdmaflow: torch.distributed's "rdmaflow" backend, a
// c10d::ProcessGroup over one rdmaflow Communicator (the manner of
// ProcessGroupGloo and oneCCL's ProcessGroupCCL). init_process_group hands it
// the job's store, rank, size and timeout; it meets the other ranks through
// that store (Bootstrap with an external store), picks a transport per pair
// as every rdmaflow job does (RDMAFLOW_TRANSPORT, default auto) and builds
// the Communicator over the channels.
//
// Every operation starts the collective on the Communicator (which runs it
// on its own lanes) and returns a Work at once; one completion thread per
// group waits for the Works in the order they started, copies results back
// where a tensor could not be used in place (not contiguous; lists of
// tensors), completes the Work's Future (what DDP's reducer waits on) and
// records failures, which wait() raises as RuntimeError naming the operation
// and the rank.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "python/src/job.h"

namespace rdmaflow::torch_backend {

class WorkRdmaflow : public c10d::Work {
 public:
  // `finish` runs once the collective succeeded, before the Work completes
  // (copies results back into the caller's tensors).
  WorkRdmaflow(int rank, c10d::OpType type, std::string what, Request request,
               std::vector<at::Tensor> outputs, std::function<void()> finish);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // On the completion thread: waits for the collective, finishes.
  void settle();

  // send and recv are settled by the caller's wait() or isCompleted(), not in
  // order by the completion thread: a recv settled in order would hold back
  // every later Work until its sender came, which may wait for one of them.
  void set_lazy() { lazy_ = true; }
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  void settle_once();
  bool lazy_ = false;
  std::once_flag settled_;
  std::string what_;
  Request request_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> finish_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupRdmaflow : public c10d::ProcessGroup {
 public:
  ProcessGroupRdmaflow(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  ~ProcessGroupRdmaflow() override;

  const std::string getBackendName() const override { return "rdmaflow"; }
  // What each pair runs over and the communicator's host groups, for logs.
  std::string describe() const;
  // process_group_memory.cc: a CPU tensor in memory registered with the
  // group's transports (rdmaflow.torch.empty; see collectives/user_memory.h
  // for its lifetime), and the fabric's counters.
  at::Tensor empty_registered(std::vector<int64_t> sizes, at::ScalarType dtype);
  FabricStats stats() const { return comm_->stats(); }
  size_t registered_buffers() const;
  // process_group_codec.cc: an f32 allreduce (average or sum) whose pieces
  // cross encoded by `codec` (docs/compression.md), with the caller's error
  // feedback in `state` (kept alive until the Work settles): what the DDP
  // communication hooks of rdmaflow.torch.hooks run.
  c10::intrusive_ptr<c10d::Work> allreduce_compressed(at::Tensor& tensor, const CodecSpec& codec,
                                                      std::shared_ptr<CodecState> state,
                                                      bool average);

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // process_group_v.cc: the operations with a layout per rank, and send/recv.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  // Queues the Work of a started request for the completion thread (or, lazy,
  // for its caller: send and recv). `keep` lives until the Work settles.
  c10::intrusive_ptr<c10d::Work> track(c10d::OpType type, const char* what, Request request,
                                       std::vector<at::Tensor> outputs,
                                       std::vector<at::Tensor> keep, std::function<void()> finish,
                                       bool lazy = false);
  // alltoallv over flat contiguous tensors (alltoall, alltoall_base with
  // splits, gather, scatter): counts and displacements in elements;
  // `agree_count` and `root` as check_agree compares them.
  c10::intrusive_ptr<c10d::Work> launch_v(c10d::OpType type, const char* what, const at::Tensor& in,
                                          const at::Tensor& out, AlltoallvLayout layout,
                                          int64_t agree_count, int64_t root,
                                          std::vector<at::Tensor> outputs,
                                          std::vector<at::Tensor> keep,
                                          std::function<void()> finish);
  // Raises a RuntimeError on every rank when the ranks disagree on the
  // operation, dtype, element count, root or reduction (RDMAFLOW_TORCH_CHECK,
  // on by default): a blocking allgather of a 40-byte descriptor per call, on
  // a lane of its own. -1: not compared (count: uneven layouts; root, op: none).
  void check_agree(c10d::OpType type, const at::Tensor& typed, int64_t count, int64_t root,
                   int64_t op = -1);
  // The call's deadline and lane (round robin over the data lanes).
  CallOptions call_options();
  bool check_ = true;
  int data_lanes_ = 1;
  int check_lane_ = 0;
  std::atomic<uint64_t> calls_{0};
  // Starts `kind` on `in`/`out` (contiguous, of `type`) and queues its Work.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* what, CollectiveKind kind,
                                        const void* in, void* out, size_t count,
                                        const at::Tensor& typed, c10d::ReduceOp op, int root,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep, std::function<void()> finish);
  void check_root(int64_t root, const char* op) const;
  void completion_loop();

  std::chrono::milliseconds timeout_;
  std::unique_ptr<Job> job_;
  Communicator* comm_ = nullptr;  // job_'s

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkRdmaflow>> pending_;
  bool stop_ = false;
  std::thread completer_;
};

}  // namespace rdmaflow::torch_backend
