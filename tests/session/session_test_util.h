// Shared by the session tests: bootstrapping forked ranks over loopback, and
// small plans to drive the session with.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "runtime/rendezvous/bootstrap.h"
#include "tests/support/process.h"
#include "tools/free_port.h"

namespace rdmaflow::testing {

inline Result<std::unique_ptr<Bootstrap>> boot_rank(int rank, int world, int port,
                                                    Millis timeout = Millis(20000)) {
  BootstrapOptions o;
  RankInfo info;
  info.rank = rank;
  info.world_size = world;
  info.local_rank = rank;
  info.local_size = world;
  info.single_host = true;
  info.source = "test";
  o.rank_info = info;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.timeout = timeout;
  return Bootstrap::create(o);
}

// A ping-pong graph on two ranks: rank 0 makes "ping" (f32 [n]), rank 1 reads
// it and makes "pong" (f32 [n]), rank 0 reads that. Optionally a dynamic
// tensor "dyn" (f32 [?, 16], size hint `hint_rows` rows) from rank 0 to 1.
inline graph::GraphFile ping_pong_graph(int64_t n, bool dynamic = false, int64_t hint_rows = 8) {
  graph::GraphFile f;
  f.graph.name = dynamic ? "ping_pong_dynamic" : "ping_pong";
  auto place = [&](int r) {
    f.placement.rank.push_back(r);
    f.placement.device.push_back("cpu:0");
  };
  (void)f.graph.add_tensor("ping", DataType::kF32, {n});
  (void)f.graph.add_tensor("pong", DataType::kF32, {n});
  (void)f.graph.add_tensor("done", DataType::kF32, {});
  (void)f.graph.add_op("make_ping", "Produce", {}, {"ping"});
  place(0);
  (void)f.graph.add_op("make_pong", "Echo", {"ping"}, {"pong"});
  place(1);
  (void)f.graph.add_op("check", "Check", {"pong"}, {"done"});
  place(0);
  if (dynamic) {
    (void)f.graph.add_tensor("dyn", DataType::kF32, {graph::kUnknownDim, 16},
                             static_cast<uint64_t>(hint_rows * 16 * 4));
    (void)f.graph.add_tensor("dyn_done", DataType::kF32, {});
    (void)f.graph.add_op("make_dyn", "Produce", {}, {"dyn"});
    place(0);
    (void)f.graph.add_op("read_dyn", "Check", {"dyn"}, {"dyn_done"});
    place(1);
  }
  return f;
}

inline Result<graph::TransferPlan> plan_of(const graph::GraphFile& f, int ranks,
                                           uint32_t depth = 2) {
  graph::PlanOptions o;
  o.pipeline_depth = depth;
  return graph::plan_transfers(f.graph, f.placement, ranks, o);
}

// The value element i of tensor `salt` holds at step s.
inline float pattern(uint64_t step, size_t i, int salt) {
  return static_cast<float>((step * 7919 + i * 31 + static_cast<size_t>(salt) * 1000003) % 65521);
}

}  // namespace rdmaflow::testing
