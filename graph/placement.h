// Placement: which rank (and which device on it) runs each op.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "graph/ir.h"

namespace rdmaflow::graph {

inline constexpr int kUnplaced = -1;
inline constexpr const char* kDefaultDevice = "cpu:0";

struct Placement {
  // Indexed by OpId; kUnplaced where no placement was given.
  std::vector<int> rank;
  std::vector<std::string> device;

  // An empty placement for every op of `graph`.
  static Placement unplaced(const Graph& graph);

  bool empty() const;  // no op placed
  void set(OpId op, int r, std::string dev = kDefaultDevice);
  int rank_of(OpId op) const { return rank[static_cast<size_t>(op)]; }

  bool operator==(const Placement&) const = default;
};

// The documented default when the user gives none (docs/graph-format.md):
// ops are taken in the deterministic topological order (Kahn, ties broken by
// file order) and cut into `num_ranks` contiguous blocks of equal op count,
// so a layered model becomes a pipeline of consecutive layer blocks.
// Fails on a cyclic graph or num_ranks < 1.
Result<Placement> default_placement(const Graph& graph, int num_ranks);

}  // namespace rdmaflow::graph
