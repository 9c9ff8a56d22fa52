#include "examples/trainer/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "collectives/communicator.h"
#include "common/env.h"
#include "common/log.h"
#include "runtime/selection/transport_select.h"

namespace rdmaflow::exec {

namespace {

class CommunicatorDataParallel final : public DataParallel {
 public:
  CommunicatorDataParallel(std::string name, std::unique_ptr<TransportSelection> selection,
                           std::unique_ptr<Communicator> comm, GradientCodec codec)
      : name_(std::move(name)),
        selection_(std::move(selection)),
        comm_(std::move(comm)),
        codec_(codec) {}
  ~CommunicatorDataParallel() override {
    comm_.reset();  // before the transports its channels belong to
    selection_->shutdown();
  }
  const std::string& transport_name() const override { return name_; }
  ExecutorHooks::AllReduce allreduce_hook() override {
    return [this](const graph::Op& op, uint64_t step, const TensorView& t) -> Status {
      if (t.dtype != DataType::kF32) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "allreduce '" + op.name + "'", -1,
                              "only f32 gradients are averaged");
      }
      CallOptions o;
      o.codec = codec_at(step);
      o.codec_state = state(op.name);
      return comm_->allreduce(t.data, t.data, static_cast<size_t>(t.elements()), DataType::kF32,
                              ReduceOp::kAvg, o);
    };
  }

 private:
  // DGC's warm-up for topk: max(ratio, 4^-(1 + step / warmup_steps)). Every
  // rank computes the same from the step, so the encodings keep one size.
  std::optional<CodecSpec> codec_at(uint64_t step) const {
    const auto& spec = codec_.spec;
    if (!spec || spec->id != CodecId::kTopK || codec_.warmup_steps <= 0) return spec;
    const double ratio = spec->param.value_or(find_codec(CodecId::kTopK)->default_param);
    const double stage = 1.0 + static_cast<double>(step / codec_.warmup_steps);
    return CodecSpec{CodecId::kTopK, std::max(ratio, std::pow(0.25, stage))};
  }

  // The error feedback of one gradient lives as long as the training.
  CodecState* state(const std::string& gradient) {
    std::lock_guard<std::mutex> lock(mu_);
    return &states_[gradient];
  }

  std::string name_;
  std::unique_ptr<TransportSelection> selection_;
  std::unique_ptr<Communicator> comm_;
  GradientCodec codec_;
  std::mutex mu_;
  std::map<std::string, CodecState> states_;  // by gradient (AllReduce op) name
};

}  // namespace

Result<std::unique_ptr<DataParallel>> connect_data_parallel(Bootstrap& boot,
                                                            const SessionOptions& options,
                                                            GradientCodec codec) {
  const Millis timeout = options.timeout.value_or(default_timeout());
  const std::string requested = requested_transport(options.transport);
  if (requested == "grpc") {
    return RDMAFLOW_ERROR(Code::kNotViable, "set up data parallelism", -1,
                          "the gRPC baseline has no allreduce; use a one-sided transport");
  }
  // A transport per peer (runtime/selection/transport_select.h); the communicator's fabric
  // registers its slots with each and exports every key through the peer's own.
  RDMAFLOW_ASSIGN_OR_RETURN(SelectedMesh mesh, connect_selected_mesh(boot, requested, timeout));
  RDMAFLOW_LOG_INFO("data parallel: transport {} (requested {}): {}", mesh.selection->name(),
                    requested, mesh.selection->summary());
  CommunicatorSetup setup;
  setup.rank = boot.rank();
  setup.world = boot.world_size();
  setup.channels = std::move(mesh.channels);
  setup.transports = mesh.selection->per_peer();
  CommunicatorOptions co;
  co.timeout = timeout;
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                            Communicator::create(std::move(setup), co));
  const std::string name = mesh.selection->name();
  return std::unique_ptr<DataParallel>(
      new CommunicatorDataParallel(name, std::move(mesh.selection), std::move(comm), codec));
}

}  // namespace rdmaflow::exec
