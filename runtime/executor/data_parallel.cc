#include "runtime/executor/data_parallel.h"

#include "allocator/env.h"
#ifdef RDMAFLOW_HAVE_COMMUNICATOR
#include "collectives/communicator.h"
#endif

namespace rdmaflow::exec {

#ifdef RDMAFLOW_HAVE_COMMUNICATOR
namespace {

class CommunicatorDataParallel final : public DataParallel {
 public:
  CommunicatorDataParallel(std::string name, std::unique_ptr<Transport> transport,
                           std::unique_ptr<Communicator> comm)
      : name_(std::move(name)), transport_(std::move(transport)), comm_(std::move(comm)) {}
  ~CommunicatorDataParallel() override {
    comm_.reset();  // before the transport its channels belong to
    transport_->shutdown();
  }
  const std::string& transport_name() const override { return name_; }
  ExecutorHooks::AllReduce allreduce_hook() override {
    return [c = comm_.get()](const graph::Op& op, uint64_t, const TensorView& t) -> Status {
      if (t.dtype != DataType::kF32) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "allreduce '" + op.name + "'", -1,
                              "only f32 gradients are averaged");
      }
      return c->allreduce(t.data, t.data, static_cast<size_t>(t.elements()), DataType::kF32,
                          ReduceOp::kAvg);
    };
  }

 private:
  std::string name_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace

Result<std::unique_ptr<DataParallel>> connect_data_parallel(Bootstrap& boot,
                                                            const SessionOptions& options) {
  const Millis timeout = options.timeout.value_or(default_timeout());
  AllGather ag = [&boot, timeout](std::span<const uint8_t> mine) {
    return boot.allgather(mine, timeout);
  };
  std::string requested = options.transport;
  if (requested.empty()) requested = env_string("RDMAFLOW_TRANSPORT").value_or("auto");
  RDMAFLOW_ASSIGN_OR_RETURN(std::string name,
                            choose_transport(requested, boot.transport_config(), ag));
  if (name == "grpc") {
    return RDMAFLOW_ERROR(Code::kNotViable, "set up data parallelism", -1,
                          "the gRPC baseline has no allreduce; use a one-sided transport");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                            make_transport(name, boot.transport_config()));
  RDMAFLOW_ASSIGN_OR_RETURN(ChannelMesh mesh, boot.connect_mesh(*transport, timeout));
  CommunicatorSetup setup;
  setup.rank = boot.rank();
  setup.world = boot.world_size();
  setup.channels = std::move(mesh);
  setup.transport = transport.get();
  CommunicatorOptions co;
  co.timeout = timeout;
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                            Communicator::create(std::move(setup), co));
  return std::unique_ptr<DataParallel>(
      new CommunicatorDataParallel(name, std::move(transport), std::move(comm)));
}
#else
Result<std::unique_ptr<DataParallel>> connect_data_parallel(Bootstrap&, const SessionOptions&) {
  return RDMAFLOW_ERROR(Code::kNotViable, "set up data parallelism", -1,
                        "this build has no collectives Communicator");
}
#endif

}  // namespace rdmaflow::exec
