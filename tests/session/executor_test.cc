// The reference executor on one rank: the MLP's gradients against finite
// differences of its loss, training lowers the loss, and every distributed
// setting's graph computes the same step as the single-replica graph.
#include "examples/trainer/graph_executor.h"

#include <gtest/gtest.h>

#include <cmath>

#include "examples/trainer/mlp_model.h"
#include "examples/trainer/synthetic_data.h"
#include "examples/trainer/trainer.h"
#include "graph/analyze.h"
#include "graph/partition.h"

namespace rdmaflow::exec {
namespace {

// One rank running a whole MLP graph (every op placed on rank 0).
struct LocalRun {
  MlpGraph mlp;
  graph::PartitionedGraph pg;
  graph::TransferPlan plan;
  std::unique_ptr<Executor> ex;
};

std::unique_ptr<LocalRun> local_run(const MlpConfig& c, MlpMode mode, int ranks,
                                    std::vector<std::string> fetches) {
  auto run = std::make_unique<LocalRun>();
  auto m = build_mlp(c, mode, ranks);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  run->mlp = std::move(*m);
  for (auto& r : run->mlp.file.placement.rank) r = 0;
  auto pg = graph::partition(run->mlp.file.graph, run->mlp.file.placement, 1);
  EXPECT_TRUE(pg.is_ok()) << pg.status().to_string();
  run->pg = std::move(*pg);
  auto plan = graph::analyze(run->pg);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  run->plan = std::move(*plan);
  auto data = std::make_shared<SyntheticData>(c.widths.front(), c.widths.back(), 7);
  ExecutorHooks hooks;
  hooks.feed = [data](const graph::Op& op, uint64_t step, int index, const TensorView& out) {
    const int64_t shard = std::get<int64_t>(op.attrs.at("shard"));
    const int64_t rows = out.dim(0);
    if (index == 0) {
      data->fill_features(step, shard * rows, rows, out.as<float>());
    } else {
      data->fill_labels(step, shard * rows, rows, out.as<int32_t>());
    }
    return Status::ok();
  };
  hooks.allreduce = [](const graph::Op&, uint64_t, const TensorView&) { return Status::ok(); };
  for (const auto& l : run->mlp.losses) fetches.push_back(l);
  ExecutorOptions eo;
  eo.fetches = fetches;
  auto ex = Executor::create(run->pg.ranks[0], run->plan, 0, nullptr, hooks, eo);
  EXPECT_TRUE(ex.is_ok()) << ex.status().to_string();
  run->ex = std::move(*ex);
  return run;
}

float loss_of(Executor& ex, const std::string& name = "loss") {
  auto f = ex.fetched(name);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f->as_floats().at(0);
}

TEST(Executor, MlpGradientsMatchFiniteDifferences) {
  MlpConfig c;
  c.widths = {6, 8, 7, 4};
  c.batch = 5;
  auto run = local_run(c, MlpMode::kSingle, 1, {"g_W1", "g_b1", "g_W2", "g_W3", "g_b3"});
  Executor& ex = *run->ex;
  std::map<std::string, std::vector<float>> base;
  for (const auto& v : ex.variable_names()) base[v] = *ex.variable(v);
  // Biases start at zero; give them values so their gradients are not special.
  for (auto& [name, val] : base) {
    if (name[0] == 'b') {
      for (size_t i = 0; i < val.size(); ++i) val[i] = 0.05f * static_cast<float>(i % 3) - 0.05f;
    }
  }
  auto reset = [&] {
    for (const auto& [name, val] : base) ASSERT_TRUE(ex.set_variable(name, val).is_ok());
  };
  reset();
  ASSERT_TRUE(ex.run_step(0).is_ok());
  std::map<std::string, std::vector<float>> grads;
  for (const char* v : {"W1", "b1", "W2", "W3", "b3"}) {
    grads[v] = ex.fetched(std::string("g_") + v)->as_floats();
  }
  // The step applied SGD: w_new = w - lr * g.
  auto w1 = *ex.variable("W1");
  for (size_t i = 0; i < w1.size(); ++i) {
    EXPECT_NEAR(w1[i], base["W1"][i] - static_cast<float>(c.learning_rate) * grads["W1"][i], 1e-6);
  }
  const float eps = 2e-3f;
  int checked = 0;
  for (const auto& [name, g] : grads) {
    for (size_t i = 0; i < g.size(); i += std::max<size_t>(1, g.size() / 7)) {
      auto plus = base, minus = base;
      plus[name][i] += eps;
      minus[name][i] -= eps;
      for (const auto& [n, v] : plus) ASSERT_TRUE(ex.set_variable(n, v).is_ok());
      ASSERT_TRUE(ex.run_step(0).is_ok());
      const float up = loss_of(ex);
      for (const auto& [n, v] : minus) ASSERT_TRUE(ex.set_variable(n, v).is_ok());
      ASSERT_TRUE(ex.run_step(0).is_ok());
      const float down = loss_of(ex);
      const double fd = (static_cast<double>(up) - down) / (2.0 * eps);
      EXPECT_NEAR(g[i], fd, 2e-3 + 2e-2 * std::abs(fd)) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

TEST(Executor, TrainingLowersTheLoss) {
  TrainConfig c;
  c.model.widths = {16, 32, 4};
  c.model.batch = 32;
  c.model.learning_rate = 0.2;
  c.mode = MlpMode::kDataParallel;  // its reference is the single-replica graph
  c.steps = 60;
  auto r = train_single(c, 1);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->loss.size(), 60u);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) first += r->loss[static_cast<size_t>(i)];
  for (int i = 50; i < 60; ++i) last += r->loss[static_cast<size_t>(i)];
  EXPECT_LT(last, 0.8 * first) << "first 10 steps " << first / 10 << ", last 10 " << last / 10;
}

// The parameter-server and model-parallel graphs, run whole on one rank,
// compute the single-replica step (up to float rounding of the shard means).
TEST(Executor, EveryGraphComputesTheSameStep) {
  MlpConfig c;
  c.widths = {12, 16, 16, 16, 5};
  c.batch = 12;
  auto single = local_run(c, MlpMode::kSingle, 1, {});
  ASSERT_TRUE(single->ex->run_step(3).is_ok());
  for (auto [mode, ranks] :
       {std::pair{MlpMode::kParameterServer, 4}, std::pair{MlpMode::kModelParallel, 4}}) {
    auto other = local_run(c, mode, ranks, {});
    ASSERT_TRUE(other->ex->run_step(3).is_ok());
    double loss = 0;
    for (const auto& l : other->mlp.losses) loss += loss_of(*other->ex, l);
    loss /= static_cast<double>(other->mlp.losses.size());
    EXPECT_NEAR(loss, loss_of(*single->ex), 1e-5) << mlp_mode_name(mode);
    for (const auto& v : single->ex->variable_names()) {
      auto a = *single->ex->variable(v);
      auto b = *other->ex->variable(v);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-5) << mlp_mode_name(mode) << " " << v << "[" << i << "]";
      }
    }
  }
}

TEST(Executor, ErrorsNameTheOp) {
  MlpConfig c;
  c.widths = {4, 3};
  c.batch = 2;
  auto m = build_mlp(c, MlpMode::kSingle, 1);
  ASSERT_TRUE(m.is_ok());
  auto pg = graph::partition(m->file.graph, m->file.placement, 1);
  ASSERT_TRUE(pg.is_ok());
  auto plan = graph::analyze(*pg);
  ASSERT_TRUE(plan.is_ok());
  // No feed for the Input op.
  auto ex = Executor::create(pg->ranks[0], *plan, 0, nullptr);
  ASSERT_TRUE(ex.is_ok()) << ex.status().to_string();
  Status st = (*ex)->run_step(0);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("'input'"), std::string::npos) << st.to_string();
  // A fetch of a tensor that does not exist.
  ExecutorOptions eo;
  eo.fetches = {"nope"};
  auto bad = Executor::create(pg->ranks[0], *plan, 0, nullptr, {}, eo);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace rdmaflow::exec
