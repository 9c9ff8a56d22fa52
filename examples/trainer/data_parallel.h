// Data parallelism for the reference executor: a collectives Communicator over
// its own channel mesh, behind the executor's AllReduce hook.
#pragma once

#include <memory>
#include <string>

#include "collectives/codecs/codec.h"
#include "common/status.h"
#include "examples/trainer/graph_executor.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/session/session.h"

namespace rdmaflow::exec {

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  virtual const std::string& transport_name() const = 0;
  // Averages a f32 tensor in place over every rank, encoded by the codec
  // (connect_data_parallel) with one CodecState (error feedback) per gradient.
  virtual ExecutorHooks::AllReduce allreduce_hook() = 0;
};

// The gradients' codec on the wire (docs/compression.md).
struct GradientCodec {
  std::optional<CodecSpec> spec;  // nullopt: RDMAFLOW_CODEC, else none
  // topk only, DGC's warm-up: the share sent starts at 1/4 and shrinks 4x
  // every `warmup_steps` steps until it reaches the codec's ratio; 0: the
  // codec's ratio from the first step.
  int warmup_steps = 0;
};

// Chooses the transport (SessionOptions / RDMAFLOW_TRANSPORT; gRPC has no
// allreduce and is refused), builds the mesh and the Communicator. Collective.
Result<std::unique_ptr<DataParallel>> connect_data_parallel(Bootstrap& boot,
                                                            const SessionOptions& options,
                                                            GradientCodec codec = {});

}  // namespace rdmaflow::exec
