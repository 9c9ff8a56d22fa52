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

// Chooses the transport (SessionOptions / RDMAFLOW_TRANSPORT; gRPC has no
// allreduce and is refused), builds the mesh and the Communicator. Collective.
// `codec`: the gradients' codec on the wire (docs/compression.md); nullopt:
// RDMAFLOW_CODEC, else none.
Result<std::unique_ptr<DataParallel>> connect_data_parallel(
    Bootstrap& boot, const SessionOptions& options, std::optional<CodecSpec> codec = std::nullopt);

}  // namespace rdmaflow::exec
