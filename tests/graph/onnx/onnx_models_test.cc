// Real models, exported by torch.onnx.export in this test run
// (export_models.py, the ctest fixture graph.onnx_export_models), loaded with
// the ONNX loader and planned as pipelines of 2-4 stages, inference and
// training. Usage: onnx_models_test MODEL_DIR [gtest flags].
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "graph/analyze.h"
#include "graph/cost.h"
#include "graph/onnx/onnx_loader.h"
#include "graph/pipeline.h"
#include "graph/plan_json.h"
#include "graph/training.h"

namespace rdmaflow::graph {
namespace {

std::string g_model_dir;  // NOLINT: set once by main

OnnxModel load(const std::string& name, std::map<std::string, int64_t> dims = {}) {
  OnnxOptions o;
  o.dims = std::move(dims);
  auto m = load_onnx_file(g_model_dir + "/" + name + ".onnx", o);
  if (!m) ADD_FAILURE() << m.status().to_string();
  return m ? std::move(*m) : OnnxModel{};
}

size_t count_type(const Graph& g, const std::string& type) {
  size_t n = 0;
  for (const Op& op : g.ops()) n += op.type == type;
  return n;
}

// Transfers per step whose tensor a Variable (a weight) produces.
size_t weight_transfers(const Graph& g, const TransferPlan& plan) {
  size_t n = 0;
  for (const auto& t : plan.transfers) {
    n += g.op(g.tensor(*g.find_tensor(t.tensor)).producer).type == "Variable";
  }
  return n;
}

// Plans `g` as 2, 3 and 4 pipeline stages and checks what the partitioner
// promises: every stage gets a fair share of the compute, weights stay with
// their readers, the plan is consistent, and it moves fewer bytes than equal
// op-count blocks, which sent weights every step.
void check_pipelines(const Graph& g) {
  for (int stages = 2; stages <= 4; ++stages) {
    SCOPED_TRACE("stages " + std::to_string(stages));
    auto p = pipeline_partition(g, stages);
    ASSERT_TRUE(p) << p.status().to_string();
    EXPECT_TRUE(p->shared_weights.empty());
    double total = 0;
    for (double c : p->stage_cost) total += c;
    for (double c : p->stage_cost) {
      EXPECT_GT(c, 0.6 * total / stages);
      EXPECT_LT(c, 1.4 * total / stages);
    }
    auto plan = plan_transfers(g, p->placement, stages);
    ASSERT_TRUE(plan) << plan.status().to_string();
    ASSERT_TRUE(check_plan(*plan));
    EXPECT_EQ(weight_transfers(g, *plan), 0u);
    uint64_t bytes = 0;
    for (const auto& t : plan->transfers) bytes += t.bytes;
    uint64_t cut = 0;
    for (uint64_t b : p->cut_bytes) cut += b;
    EXPECT_EQ(bytes, cut);  // the transfers are exactly what the cuts cross

    auto blocks = default_placement(g, stages);
    ASSERT_TRUE(blocks);
    auto block_plan = plan_transfers(g, *blocks, stages);
    ASSERT_TRUE(block_plan);
    uint64_t block_bytes = 0;
    for (const auto& t : block_plan->transfers) block_bytes += t.bytes;
    EXPECT_GT(weight_transfers(g, *block_plan), 0u);
    EXPECT_LT(bytes, block_bytes);
  }
}

TEST(OnnxModels, Resnet18) {
  OnnxModel m = load("resnet18");
  const Graph& g = m.file.graph;
  EXPECT_EQ(count_type(g, "Conv"), 20u);
  EXPECT_EQ(count_type(g, "Gemm"), 1u);
  EXPECT_EQ(count_type(g, "Input"), 1u);
  EXPECT_EQ(count_type(g, "Variable"), m.summary.initializers);
  EXPECT_GT(m.summary.weight_bytes, 44u << 20);  // 11.7 M parameters
  EXPECT_EQ(m.summary.tensors_without_shape, 0u);
  for (const Tensor& t : g.tensors()) EXPECT_TRUE(is_static(t.shape)) << t.name;
  // About 1.8 G multiply-adds: 3.6 GFLOP in the convolutions and the classifier.
  double flops = 0;
  const auto cost = estimate_costs(g, 0);
  for (size_t i = 0; i < g.num_ops(); ++i) {
    if (g.ops()[i].type == "Conv" || g.ops()[i].type == "Gemm") flops += cost[i];
  }
  EXPECT_NEAR(flops / 1e9, 3.64, 0.1);
  check_pipelines(g);
}

TEST(OnnxModels, MobilenetV3Small) {
  OnnxModel m = load("mobilenet_v3_small");
  const Graph& g = m.file.graph;
  EXPECT_GT(count_type(g, "Conv"), 50u);
  for (const Tensor& t : g.tensors()) EXPECT_TRUE(is_static(t.shape)) << t.name;
  check_pipelines(g);
}

TEST(OnnxModels, TransformerDynamicAxesBecomeDynamicWithHints) {
  OnnxModel m = load("transformer", {{"batch", 8}, {"seq", 64}});
  const Graph& g = m.file.graph;
  const std::set<std::string> dims(m.summary.symbolic_dims.begin(), m.summary.symbolic_dims.end());
  EXPECT_TRUE(dims.count("batch") && dims.count("seq"));
  const Tensor& tokens = g.tensor(*g.find_tensor("tokens"));
  EXPECT_EQ(tokens.dtype, DataType::kI64);
  EXPECT_EQ(tokens.shape, (Shape{kUnknownDim, kUnknownDim}));
  EXPECT_EQ(tokens.size_hint, 8u * 64 * 8);
  const Tensor& logits = g.tensor(*g.find_tensor("logits"));
  EXPECT_EQ(logits.shape, (Shape{kUnknownDim, kUnknownDim, 1000}));
  EXPECT_EQ(logits.size_hint, 8u * 64 * 1000 * 4);
  EXPECT_EQ(count_type(g, "MatMul") + count_type(g, "Gemm") > 8, true);
}

// Training: every float activation sent forward from s to d has its gradient
// sent back from d to s, and nothing else crosses.
TEST(OnnxModels, TransformerTrainingPlansOneGradientBackPerActivation) {
  OnnxModel m = load("transformer", {{"batch", 8}, {"seq", 64}});
  const Graph& g = m.file.graph;
  for (int stages = 2; stages <= 4; ++stages) {
    SCOPED_TRACE("stages " + std::to_string(stages));
    auto p = pipeline_partition(g, stages);
    ASSERT_TRUE(p) << p.status().to_string();
    auto fwd = plan_transfers(g, p->placement, stages);
    ASSERT_TRUE(fwd) << fwd.status().to_string();
    auto t = add_backward(g, p->placement, PlanOptions{}.dynamic_size_hint);
    ASSERT_TRUE(t) << t.status().to_string();
    auto plan = plan_transfers(t->graph, t->placement, stages);
    ASSERT_TRUE(plan) << plan.status().to_string();
    ASSERT_TRUE(check_plan(*plan));
    std::set<std::tuple<std::string, int, int>> sent;
    for (const auto& x : plan->transfers) sent.emplace(x.tensor, x.src_rank, x.dst_rank);
    // The gradient of x that crosses is its sum on the reading rank
    // ("grad/x@d"), or its one partial there ("grad/x/<op>").
    auto gradient_sent = [&](const std::string& x, int from, int to) {
      for (const auto& t : plan->transfers) {
        const std::string g = gradient_name(x);
        if (t.src_rank == from && t.dst_rank == to && t.tensor.rfind(g, 0) == 0 &&
            (t.tensor.size() == g.size() || t.tensor[g.size()] == '@' ||
             t.tensor[g.size()] == '/')) {
          return true;
        }
      }
      return false;
    };
    size_t activations = 0;
    for (const auto& x : fwd->transfers) {
      EXPECT_TRUE(sent.count({x.tensor, x.src_rank, x.dst_rank})) << x.tensor;
      if (x.dtype != DataType::kF32) continue;
      ++activations;
      EXPECT_TRUE(gradient_sent(x.tensor, x.dst_rank, x.src_rank))
          << "no gradient back for " << x.tensor;
    }
    EXPECT_GE(activations, static_cast<size_t>(stages - 1));
    size_t gradients = 0;
    for (const auto& x : plan->transfers) {
      if (x.tensor.rfind("grad/", 0) != 0) continue;
      ++gradients;
      EXPECT_LT(x.dst_rank, x.src_rank) << x.tensor;  // gradients flow back up the pipeline
    }
    EXPECT_EQ(gradients, activations);
    EXPECT_EQ(plan->transfers.size(), fwd->transfers.size() + activations);
  }
}

}  // namespace
}  // namespace rdmaflow::graph

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [gtest flags]\n", argv[0]);
    return 2;
  }
  rdmaflow::graph::g_model_dir = argv[1];
  return RUN_ALL_TESTS();
}
