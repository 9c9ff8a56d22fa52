// Distributed training agrees with a single-process run of the same graph.
//
// Four forked ranks train the MLP for a few steps over real loopback
// transports, as parameter servers, model parallel and data parallel; each
// rank then runs the single-process reference itself and compares the
// variables it holds. Parameter-server and model-parallel runs execute the
// same kernels on the same inputs in the same order, so they must agree to
// the last bit (we allow 1e-6). Data parallel averages shard gradients with
// an allreduce instead of computing the full-batch mean in one sum, so float
// rounding differs: we allow 1e-4 absolute after 8 steps.
#include <gtest/gtest.h>

#include <cmath>

#include "examples/trainer/trainer.h"
#include "tests/session/session_test_util.h"

namespace rdmaflow::exec {
namespace {

using namespace std::chrono_literals;
using rdmaflow::dev::free_port;
using rdmaflow::testing::boot_rank;
using rdmaflow::testing::run_ranks;

constexpr int kWorld = 4;

TrainConfig small_config(MlpMode mode) {
  TrainConfig c;
  c.mode = mode;
  c.model.widths = {32, 64, 48, 40, 10};  // 4 layers: one per rank when model parallel
  c.model.batch = 24;                     // 3 workers x 8, 4 replicas x 6
  c.model.learning_rate = 0.1;
  c.steps = 8;
  c.seed = 11;
  return c;
}

struct Case {
  MlpMode mode;
  std::string transport;
  double tolerance;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << mlp_mode_name(c.mode) << " over " << c.transport;
}

class Agreement : public ::testing::TestWithParam<Case> {};

TEST_P(Agreement, DistributedMatchesSingleProcess) {
  const Case k = GetParam();
  const int port = free_port();
  auto r = run_ranks(kWorld, [&](int rank, int world, rdmaflow::testing::Exchange&) -> int {
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    const TrainConfig c = small_config(k.mode);
    SessionOptions so;
    so.transport = k.transport;
    so.timeout = 20000ms;
    RF_ASSIGN_OR_FAIL(TrainReport dist, train(c, *boot, so));
    RF_ASSIGN_OR_FAIL(TrainReport single, train_single(c, world));
    RF_ASSERT(dist.loss.size() == single.loss.size());
    for (size_t s = 0; s < dist.loss.size(); ++s) {
      EXPECT_NEAR(dist.loss[s], single.loss[s], 1e-4) << "loss at step " << s;
    }
    int compared = 0;
    double worst = 0;
    for (const auto& [name, value] : dist.variables) {
      auto it = single.variables.find(name);
      RF_ASSERT(it != single.variables.end());
      RF_ASSERT(it->second.size() == value.size());
      for (size_t i = 0; i < value.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(value[i] - it->second[i])));
      }
      ++compared;
    }
    EXPECT_LE(worst, k.tolerance) << "rank " << rank << " variables differ by up to " << worst;
    // Every variable is held somewhere: servers (ps), its layer's rank (mp), every rank (dp).
    if (k.mode == MlpMode::kDataParallel) RF_ASSERT(compared == 8);
    if (k.mode == MlpMode::kModelParallel) RF_ASSERT(compared == 2);
    if (k.mode == MlpMode::kParameterServer) RF_ASSERT(compared == (rank == 0 ? 8 : 0));
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

INSTANTIATE_TEST_SUITE_P(Modes, Agreement,
                         ::testing::Values(Case{MlpMode::kParameterServer, "tcp", 1e-6},
                                           Case{MlpMode::kModelParallel, "tcp", 1e-6},
                                           Case{MlpMode::kDataParallel, "tcp", 1e-4},
                                           Case{MlpMode::kParameterServer, "grpc", 1e-6},
                                           Case{MlpMode::kModelParallel, "grpc", 1e-6}),
                         [](const auto& info) {
                           return mlp_mode_name(info.param.mode) + "_" + info.param.transport;
                         });

}  // namespace
}  // namespace rdmaflow::exec
