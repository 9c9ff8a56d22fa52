#include "graph/topo_order.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <string>

namespace rdmaflow::graph {

namespace {

// Ops left over by Kahn's algorithm all sit on or behind a cycle; walk back
// along inputs whose producer is also left over until an op repeats.
std::string describe_cycle(const Graph& g, const std::vector<int>& indegree) {
  OpId start = kNoOp;
  for (size_t i = 0; i < indegree.size(); ++i) {
    if (indegree[i] > 0) {
      start = static_cast<OpId>(i);
      break;
    }
  }
  if (start == kNoOp) return "cycle";
  std::vector<int> seen_at(g.num_ops(), -1);
  std::vector<OpId> path;
  OpId cur = start;
  while (seen_at[static_cast<size_t>(cur)] < 0) {
    seen_at[static_cast<size_t>(cur)] = static_cast<int>(path.size());
    path.push_back(cur);
    OpId next = kNoOp;
    for (TensorId t : g.op(cur).inputs) {
      OpId p = g.tensor(t).producer;
      if (p != kNoOp && indegree[static_cast<size_t>(p)] > 0) {
        next = p;
        break;
      }
    }
    if (next == kNoOp) return "cycle through op '" + g.op(start).name + "'";
    cur = next;
  }
  // path[seen_at[cur]..] is the cycle, walked against the edges; print it forward.
  std::vector<OpId> cycle(path.begin() + seen_at[static_cast<size_t>(cur)], path.end());
  std::reverse(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string s = "cycle: ";
  constexpr size_t kMaxShown = 16;
  for (size_t i = 0; i < cycle.size() && i < kMaxShown; ++i) {
    s += "'" + g.op(cycle[i]).name + "' -> ";
  }
  if (cycle.size() > kMaxShown) s += "... -> ";
  s += "'" + g.op(cycle.front()).name + "'";
  return s;
}

}  // namespace

Result<std::vector<OpId>> topological_order(const Graph& g) {
  const size_t n = g.num_ops();
  std::vector<int> indegree(n, 0);
  // An op waits once per distinct producing op of its inputs.
  std::vector<OpId> counted_for(n, kNoOp);  // producer p already counted for op i
  for (size_t i = 0; i < n; ++i) {
    for (TensorId t : g.ops()[i].inputs) {
      OpId p = g.tensor(t).producer;
      if (p == kNoOp || counted_for[static_cast<size_t>(p)] == static_cast<OpId>(i)) continue;
      counted_for[static_cast<size_t>(p)] = static_cast<OpId>(i);
      ++indegree[i];
    }
  }
  std::priority_queue<OpId, std::vector<OpId>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push(static_cast<OpId>(i));
  }
  std::vector<OpId> order;
  order.reserve(n);
  std::vector<OpId> last_seen(n, kNoOp);  // dedups consumer edges per producer
  while (!ready.empty()) {
    OpId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (TensorId t : g.op(id).outputs) {
      for (OpId c : g.tensor(t).consumers) {
        if (last_seen[static_cast<size_t>(c)] == id) continue;
        last_seen[static_cast<size_t>(c)] = id;
        if (--indegree[static_cast<size_t>(c)] == 0) ready.push(c);
      }
    }
  }
  if (order.size() != n) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "validate graph", -1,
                          describe_cycle(g, indegree));
  }
  return order;
}

}  // namespace rdmaflow::graph
