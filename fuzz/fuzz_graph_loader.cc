// libFuzzer target: the graph, placement and plan loaders must return an error
// for anything malformed, never crash, hang or leak; whatever loads must
// round-trip and plan to a plan that passes check_plan.
// Built and run by scripts/fuzz.sh (clang, -DRDMAFLOW_FUZZ=ON).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "graph/placement.h"
#include "graph/plan_json.h"

namespace rg = rdmaflow::graph;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  // Plans: must either load and pass check_plan (it does so itself) or fail.
  (void)rg::parse_plan_json(text);

  auto file = rg::parse_graph_json(text);
  if (!file) return 0;
  const rg::Graph& g = file->graph;

  // The writer's output loads back into an equal graph and writes identically.
  std::string once = rg::write_graph_json(g, &file->placement);
  auto again = rg::parse_graph_json(once);
  // The graph JSON round trip, and a stable writer.
  FUZZ_CHECK(again && again->graph == g && again->placement == file->placement);
  FUZZ_CHECK(rg::write_graph_json(again->graph, &again->placement) == once);

  // Placements against this graph, from the same bytes.
  (void)rg::parse_placement_json(text, g);

  // Plan small graphs with their own placement or the default one.
  if (g.num_ops() > 2000) return 0;
  rg::Placement p = file->placement;
  int ranks = 1 + static_cast<int>(size % 4);
  if (!p.empty()) {
    ranks = 1;
    for (int r : p.rank) ranks = r + 1 > ranks ? r + 1 : ranks;
    if (ranks > 64) return 0;
  } else {
    auto d = rg::default_placement(g, ranks);
    FUZZ_CHECK(d);  // a valid graph has a default placement
    p = std::move(*d);
  }
  auto plan = rg::plan_transfers(g, p, ranks);
  if (!plan) return 0;  // e.g. a placement that leaves ops unplaced
  FUZZ_CHECK(rg::check_plan(*plan));
  auto parsed = rg::parse_plan_json(rg::write_plan_json(*plan));
  FUZZ_CHECK(parsed && *parsed == *plan);  // the plan JSON round trip
  return 0;
}
