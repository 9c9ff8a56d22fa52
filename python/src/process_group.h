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

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
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

 private:
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

 private:
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
