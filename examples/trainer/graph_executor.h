// The reference executor: runs one rank's part of a partitioned graph, step
// after step, in the order the TransferPlan scheduled, with real kernels
// (examples/trainer/kernels, Eigen) and a Session for the Send and Recv ops.
//
// Per op type:
//  - compute ops: the registered kernel (kernel.h). An output the plan placed
//    in registered memory (because it is sent) is allocated there through
//    Session::output_buffer, the allocation hook, so the Send is a plain write
//    of the producer's own output.
//  - Send / Recv (added by the partitioner): Session::send / Session::recv. A
//    received tensor is a view of the receive slot; readers use it in place.
//  - Variable: persistent state, initialized from the op's "init" attribute
//    ("glorot" (default) or "zeros") with a seed, the same on every rank. An
//    ApplySGD whose first input is a variable's tensor gives its value for the
//    next step (committed when the step ends).
//  - Input: filled by ExecutorHooks::feed.
//  - AllReduce: copies its input and reduces it in place through
//    ExecutorHooks::allreduce (data-parallel gradient averaging).
//
// Not thread safe: one thread runs the steps.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "examples/trainer/kernel.h"
#include "examples/trainer/tensor.h"
#include "graph/partition.h"
#include "graph/transfer_plan.h"
#include "runtime/session/session.h"

namespace rdmaflow::exec {

struct ExecutorHooks {
  // Fills output `index` of an Input op for `step` (memory already allocated).
  using Feed =
      std::function<Status(const graph::Op& op, uint64_t step, int index, const TensorView& out)>;
  // Reduces `tensor` in place across replicas (AllReduce ops).
  using AllReduce =
      std::function<Status(const graph::Op& op, uint64_t step, const TensorView& tensor)>;
  Feed feed;
  AllReduce allreduce;
};

struct ExecutorOptions {
  // Tensors whose value each step is copied out right after it is produced
  // (or received), for fetched().
  std::vector<std::string> fetches;
  uint64_t seed = 1;  // variable initialization
};

// Where a step's time went on this rank.
struct StepProfile {
  double total_ms = 0;
  double compute_ms = 0;  // kernels, Variable and Input ops
  double send_ms = 0;     // Send ops (credit waits, staging copies, issuing writes)
  double recv_ms = 0;     // Recv ops (waiting for data)
  double allreduce_ms = 0;
  double session_ms = 0;                     // begin_step + end_step
  std::map<std::string, double> by_type_ms;  // per op type
};

struct FetchedTensor {
  DataType dtype = DataType::kF32;
  Dims dims;
  std::vector<uint8_t> bytes;

  std::vector<float> as_floats() const;
};

class Executor {
 public:
  // `rank_graph` is this rank's part of the partitioned graph, `plan` the
  // TransferPlan made from the same partition. `session` may be null when the
  // rank has no Send or Recv ops.
  static Result<std::unique_ptr<Executor>> create(const graph::RankGraph& rank_graph,
                                                  const graph::TransferPlan& plan, int rank,
                                                  Session* session, ExecutorHooks hooks = {},
                                                  ExecutorOptions options = {});

  // Runs every op of the rank once, for `step` (begin_step .. end_step on the
  // session). On error the step is abandoned; the error names the op.
  Status run_step(uint64_t step);

  // The value of a fetched tensor in the last step that produced it.
  Result<FetchedTensor> fetched(const std::string& tensor) const;

  // Variables of this rank by Variable op name, and their current values.
  std::vector<std::string> variable_names() const;
  Result<std::vector<float>> variable(const std::string& name) const;
  Status set_variable(const std::string& name, const std::vector<float>& value);

  const StepProfile& last_profile() const { return profile_; }
  const graph::Graph& graph() const { return graph_; }

 private:
  struct Variable {
    graph::TensorId tensor = -1;  // the Variable op's output
    HostBuffer state;
    size_t bytes = 0;
  };
  struct Scheduled {
    graph::OpId op = graph::kNoOp;
    graph::OpKind kind = graph::OpKind::kCompute;
    int64_t transfer = -1;
    Kernel kernel;  // compute ops other than Variable / Input / AllReduce
  };
  class Context;

  Executor() = default;
  Status run_op(const Scheduled& s, uint64_t step);
  Result<TensorView> allocate(graph::TensorId t, DataType dtype, const Dims& dims, uint64_t step);
  void capture(graph::TensorId t);

  graph::Graph graph_;
  int rank_ = 0;
  Session* session_ = nullptr;
  ExecutorHooks hooks_;
  ExecutorOptions options_;
  std::vector<Scheduled> schedule_;
  std::vector<TensorView> values_;  // per local tensor, this step
  std::vector<HostBuffer> heap_;    // per local tensor
  std::vector<bool> fetch_;         // per local tensor
  std::map<std::string, FetchedTensor> fetched_;
  std::map<std::string, Variable> variables_;  // by Variable op name
  std::map<graph::TensorId, std::string> var_of_tensor_;
  std::vector<std::pair<std::string, graph::TensorId>> updates_;  // ApplySGD: variable, new value
  StepProfile profile_;
};

}  // namespace rdmaflow::exec
