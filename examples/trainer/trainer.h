// Training driver: builds the MLP graph for a mode (mlp_model.h), plans it,
// sets up a Session (or, data-parallel, a collectives Communicator), and runs
// the reference executor for a number of steps on synthetic data.
//
//   auto boot = Bootstrap::create();
//   TrainConfig c;  c.mode = MlpMode::kParameterServer;  c.steps = 50;
//   auto report = train(c, **boot);                  // collective
//   auto reference = train_single(c, (*boot)->world_size());
//
// train_single runs the same computation in one process: the same graph with
// every op on one rank (parameter server, model parallel), or the
// single-replica graph on the full batch (data parallel). Tests compare the
// final variables of both.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "collectives/codecs/codec.h"
#include "common/status.h"
#include "examples/trainer/graph_executor.h"
#include "examples/trainer/mlp_model.h"
#include "graph/transfer_plan.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/session/session.h"

namespace rdmaflow::exec {

struct StepReport {
  uint64_t step = 0;
  double step_ms = 0;
  double loss = 0;  // mean of the loss tensors this rank computed; NaN when none
};

struct TrainConfig {
  MlpConfig model;
  MlpMode mode = MlpMode::kParameterServer;
  int servers = 1;  // parameter-server mode
  int steps = 10;
  // Leading steps left out of TrainReport::profile_sum (registration, first
  // touches, mappings); all steps count when there are no more than this.
  int warmup_steps = 1;
  uint64_t seed = 1;
  graph::PlanOptions plan;
  // Data parallel: the gradients' codec on the wire (docs/compression.md);
  // nullopt: RDMAFLOW_CODEC, else none.
  std::optional<CodecSpec> codec;
  // topk: DGC's warm-up (GradientCodec::warmup_steps in data_parallel.h); 0: none.
  int codec_warmup_steps = 0;
  // Called on every rank after each step.
  std::function<void(const StepReport&)> on_step;
};

struct TrainReport {
  std::string transport;
  // Per step: the mean of every loss tensor of the job (gathered from all ranks).
  std::vector<double> loss;
  std::vector<double> step_ms;  // this rank's
  SessionStats session;         // this rank's
  StepProfile last_profile;     // this rank's last step
  // Summed over this rank's steps after TrainConfig::warmup_steps.
  StepProfile profile_sum;
  int profiled_steps = 0;  // how many steps profile_sum holds
  // This rank's variables at the end, by name.
  std::map<std::string, std::vector<float>> variables;
  // Bytes crossing ranks per step in the whole job, from the plan (data
  // parallel: the allreduce's payload per rank times the ranks).
  uint64_t job_bytes_per_step = 0;
};

// Trains on every rank of `boot` (collective).
Result<TrainReport> train(const TrainConfig& config, Bootstrap& boot, SessionOptions options = {});

// The single-process reference for `config` as run on `ranks` ranks.
Result<TrainReport> train_single(const TrainConfig& config, int ranks);

// The plan train() runs for `config` on `ranks` ranks (with the graph it came from).
struct PlannedMlp {
  MlpGraph mlp;
  graph::TransferPlan plan;
};
Result<PlannedMlp> plan_mlp(const TrainConfig& config, int ranks);

}  // namespace rdmaflow::exec
