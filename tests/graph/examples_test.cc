// The shipped example graphs, the memory planner on its own, and the reuse
// figure the docs quote.
#include <gtest/gtest.h>

#include <string>

#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "graph/memory_planner.h"
#include "graph/plan_json.h"
#include "graph/synthetic.h"
#include "graph/validate.h"

namespace rdmaflow::graph {
namespace {

const std::string kExamples = RDMAFLOW_GRAPH_EXAMPLES;

struct Example {
  const char* file;
  GraphFile (*make)();
  int ranks;
};

const Example kAll[] = {
    {"mlp_model_parallel.json", [] { return synthetic::mlp_model_parallel(); }, 4},
    {"parameter_server.json", [] { return synthetic::parameter_server(); }, 8},
    {"unrolled_rnn.json", [] { return synthetic::unrolled_rnn(); }, 2},
};

TEST(Examples, LoadValidatePlanAndRoundTrip) {
  for (const Example& ex : kAll) {
    SCOPED_TRACE(ex.file);
    auto text = read_text_file(kExamples + "/" + ex.file);
    ASSERT_TRUE(text) << text.status().to_string();
    auto f = parse_graph_json(*text);
    ASSERT_TRUE(f) << f.status().to_string();
    // The shipped file is exactly what its generator writes (regenerate with
    // rdmaflow-make-examples graph/examples).
    GraphFile gen = ex.make();
    EXPECT_EQ(write_graph_json(gen.graph, &gen.placement), *text);
    EXPECT_EQ(write_graph_json(f->graph, &f->placement), *text);
    ASSERT_TRUE(validate_placement(f->graph, f->placement, ex.ranks));
    auto plan = plan_transfers(f->graph, f->placement, ex.ranks);
    ASSERT_TRUE(plan) << plan.status().to_string();
    EXPECT_TRUE(check_plan(*plan));
    EXPECT_FALSE(plan->transfers.empty());
    auto parsed = parse_plan_json(write_plan_json(*plan));
    ASSERT_TRUE(parsed) << parsed.status().to_string();
    EXPECT_TRUE(*parsed == *plan);
  }
}

TEST(Examples, ParameterServerHasOneTransferPerTensorAndWorker) {
  GraphFile f = synthetic::parameter_server(/*workers=*/6, /*servers=*/2, /*layers=*/16);
  auto plan = plan_transfers(f.graph, f.placement, 8);
  ASSERT_TRUE(plan);
  // Each weight goes once to each worker although forward and backward both
  // read it; each worker's gradient goes once to its server.
  EXPECT_EQ(plan->transfers.size(), 16u * 6 + 16u * 6);
  for (int w = 2; w < 8; ++w) EXPECT_EQ(plan->ranks[static_cast<size_t>(w)].recvs.size(), 16u);
}

TEST(Examples, RecurrentGraphReusesRegisteredMemory) {
  GraphFile f = synthetic::unrolled_rnn();
  auto plan = plan_transfers(f.graph, f.placement, 2);
  ASSERT_TRUE(plan);
  EXPECT_GE(plan->transfers.size(), 100u);
  uint64_t with = 0, without = 0;
  uint32_t dynamic = 0;
  for (const RankPlan& r : plan->ranks) {
    with += r.registered_bytes;
    without += r.registered_bytes_without_reuse;
    dynamic += r.dynamic_in;
  }
  EXPECT_EQ(dynamic, 1u);  // the encoder's output, of run-time length
  EXPECT_LT(with, without);
  // The dynamic transfer reserves its header plus the size hint.
  const TransferSpec& enc = plan->transfers[0];
  EXPECT_EQ(enc.tensor, "enc_out");
  EXPECT_TRUE(enc.dynamic);
  EXPECT_EQ(enc.bytes, 128u * 32 * 512 * 4);
  EXPECT_EQ(enc.meta_bytes, plan->options.meta_bytes);
  EXPECT_GE(enc.recv_slot.size, enc.bytes + enc.meta_bytes);
}

TEST(MemoryPlanner, DisjointLifetimesShareOverlappingDoNot) {
  // a [0,2) and b [2,4) can share; c [1,3) overlaps both.
  std::vector<MemoryRequest> req{{100, 0, 2}, {100, 2, 4}, {100, 1, 3}};
  MemoryLayout l = plan_memory(req, 64);
  EXPECT_EQ(l.offset[0], l.offset[1]);
  EXPECT_NE(l.offset[2], l.offset[0]);
  EXPECT_EQ(l.arena_bytes, 256u);
  EXPECT_EQ(l.bytes_without_reuse, 384u);
  for (uint64_t off : l.offset) EXPECT_EQ(off % 64, 0u);
}

TEST(MemoryPlanner, FreedBlocksCoalesceAndBestFit) {
  // Two small buffers die, then a large one fits in their coalesced space.
  std::vector<MemoryRequest> req{{64, 0, 1}, {64, 0, 1}, {128, 1, 2}, {8, 0, 3}};
  MemoryLayout l = plan_memory(req, 64);
  EXPECT_EQ(l.arena_bytes, 192u);
  EXPECT_LT(l.offset[2], 192u);
  // Zero-sized requests still get their own aligned unit.
  MemoryLayout z = plan_memory({{0, 0, 1}, {0, 0, 1}}, 16);
  EXPECT_NE(z.offset[0], z.offset[1]);
  EXPECT_EQ(z.arena_bytes, 32u);
}

}  // namespace
}  // namespace rdmaflow::graph
