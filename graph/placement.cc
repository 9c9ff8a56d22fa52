#include "graph/placement.h"

#include <utility>

#include "graph/topo_order.h"

namespace rdmaflow::graph {

Placement Placement::unplaced(const Graph& graph) {
  Placement p;
  p.rank.assign(graph.num_ops(), kUnplaced);
  p.device.assign(graph.num_ops(), std::string());
  return p;
}

bool Placement::empty() const {
  for (int r : rank) {
    if (r != kUnplaced) return false;
  }
  return true;
}

void Placement::set(OpId op, int r, std::string dev) {
  rank[static_cast<size_t>(op)] = r;
  device[static_cast<size_t>(op)] = std::move(dev);
}

Result<Placement> default_placement(const Graph& graph, int num_ranks) {
  if (num_ranks < 1) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "default placement", -1,
        "the number of ranks must be at least 1, got " + std::to_string(num_ranks));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<OpId> order, topological_order(graph));
  Placement p = Placement::unplaced(graph);
  const size_t n = order.size();
  const auto ranks = static_cast<size_t>(num_ranks);
  for (size_t i = 0; i < n; ++i) {
    // Block i*ranks/n: sizes differ by at most one op.
    p.set(order[i], static_cast<int>(i * ranks / n));
  }
  return p;
}

}  // namespace rdmaflow::graph
