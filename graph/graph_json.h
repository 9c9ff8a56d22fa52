// The JSON graph format (docs/graph-format.md): loader and writer.
//
// The writer's output loads back into an equal Graph and Placement, and writing
// that again gives the same bytes. The loader never crashes or throws on
// malformed, truncated or hostile input: it returns an error that says where
// ("ops[3] 'fc2': ...") and what is wrong.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "graph/ir.h"
#include "graph/placement.h"

namespace rdmaflow::graph {

inline constexpr size_t kMaxDims = 32;    // dimensions per tensor
inline constexpr int kMaxJsonDepth = 32;  // nesting of the JSON document
inline constexpr int kMaxRanks = 4096;    // ranks a placement or a plan may name

struct GraphFile {
  Graph graph;
  // Per-op "rank"/"device" found in the file; Placement::unplaced when none.
  Placement placement;
};

// Parses and validates (validate()) a graph document.
Result<GraphFile> parse_graph_json(std::string_view text);
Result<GraphFile> load_graph_file(const std::string& path);

// Writes `graph`, with each op's rank and device when `placement` is given.
std::string write_graph_json(const Graph& graph, const Placement* placement = nullptr);

// A placement document: {"ops": {"fc1": 0, "fc2": {"rank": 1, "device": "gpu:0"}}}.
// Ops it does not name stay unplaced (validate_placement reports them).
Result<Placement> parse_placement_json(std::string_view text, const Graph& graph);
Result<Placement> load_placement_file(const std::string& path, const Graph& graph);
std::string write_placement_json(const Graph& graph, const Placement& placement);

// Reads a whole file; the error names the path.
Result<std::string> read_text_file(const std::string& path);

}  // namespace rdmaflow::graph
