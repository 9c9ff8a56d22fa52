// Training the reference MLP data parallel with each gradient codec on the
// wire (docs/compression.md) reaches a loss at most 5% above uncompressed
// training's in the same number of steps (lower passes: with error feedback
// top-k and 1-bit often end lower, as if stepping further). Four forked ranks
// over TCP, one bootstrap, one training per codec after the uncompressed one.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "examples/trainer/trainer.h"
#include "tests/session/session_test_util.h"

namespace rdmaflow::exec {
namespace {

using namespace std::chrono_literals;
using rdmaflow::dev::free_port;
using rdmaflow::testing::boot_rank;
using rdmaflow::testing::run_ranks;

// The loss at the end: the mean of the last few steps (one step's loss is
// noisy: each step has its own synthetic batch).
double final_loss(const TrainReport& r) {
  const size_t tail = 5;
  return std::accumulate(r.loss.end() - tail, r.loss.end(), 0.0) / tail;
}

TEST(CodecTraining, EveryCodecWithinFivePercentOfUncompressed) {
  const int port = free_port();
  testing::RunOptions ro;
  ro.timeout = 120s;
  auto r = run_ranks(
      4,
      [&](int rank, int world, testing::Exchange&) -> int {
        RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
        TrainConfig c;
        c.mode = MlpMode::kDataParallel;
        c.model.widths = {32, 64, 48, 10};
        c.model.batch = 32;
        c.model.learning_rate = 0.1;
        c.steps = 400;  // about 2 s per training here
        c.seed = 5;
        c.codec = CodecSpec{};  // uncompressed, whatever RDMAFLOW_CODEC says
        // DGC's warm-up for topk: the share sent goes 25%, 6.25%, 1.56%, then
        // the codec's 1% after 75 steps. Error feedback delays what top-k
        // holds back by about 1 / ratio steps, which is long for a model of
        // 5.6 k weights and few steps: at 200 steps topk:0.01 ended 13% above
        // uncompressed without warm-up and 8.6% with it; at 400 steps (here)
        // 14% below.
        c.codec_warmup_steps = 25;
        SessionOptions so;
        so.transport = "tcp";
        so.timeout = 20000ms;
        RF_ASSIGN_OR_FAIL(TrainReport plain, train(c, *boot, so));
        const double reference = final_loss(plain);
        RF_ASSERT(reference < 0.9 * plain.loss.front());  // it does learn
        for (const auto& row : codec_table()) {
          c.codec = CodecSpec{row.id, std::nullopt};
          RF_ASSIGN_OR_FAIL(TrainReport coded, train(c, *boot, so));
          const double loss = final_loss(coded);
          if (rank == 0) {
            std::printf("codec %-7s final loss %.5f (uncompressed %.5f, %+.2f%%)\n",
                        std::string(row.name).c_str(), loss, reference,
                        100 * (loss - reference) / reference);
          }
          EXPECT_LE(loss, 1.05 * reference)
              << row.name << ": final loss " << loss << " against " << reference;
        }
        return 0;
      },
      ro);
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::exec
