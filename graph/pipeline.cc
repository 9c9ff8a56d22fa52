#include "graph/pipeline.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "graph/cost.h"
#include "graph/topo_order.h"

namespace rdmaflow::graph {

namespace {

constexpr const char* kPipeline = "pipeline partition";

}  // namespace

Result<PipelinePartition> pipeline_partition(const Graph& g, int stages, const PipelineOptions& o) {
  if (stages < 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kPipeline, -1,
                          "the number of stages must be at least 1, got " + std::to_string(stages));
  }
  if (!(o.tolerance >= 0 && o.tolerance <= 1)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kPipeline, -1,
                          "the tolerance must be in [0, 1], got " + std::to_string(o.tolerance));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<OpId> order, topological_order(g));
  const std::vector<double> cost = estimate_costs(g, o.dynamic_hint);

  // Constant ops (weights, Constant, and ops that only read constants, such as
  // the Identity copies exporters make of a deduplicated weight) and graph
  // inputs float: each goes where its first reader goes. The rest are cut.
  std::vector<bool> constant(g.num_ops(), false), floating(g.num_ops(), false);
  for (OpId op : order) {
    const Op& o = g.op(op);
    bool c = o.inputs.empty() ? o.type != "Input" : true;
    for (TensorId t : o.inputs) c = c && constant[static_cast<size_t>(g.tensor(t).producer)];
    constant[static_cast<size_t>(op)] = c;
    floating[static_cast<size_t>(op)] = c || o.inputs.empty();
  }
  // pos: where each op sits in the order that is cut; a floating op sits
  // with its first reader (-1 when nothing that is cut reads it).
  std::vector<OpId> seq;
  seq.reserve(order.size());
  std::vector<int64_t> pos(g.num_ops(), -1);
  for (OpId op : order) {
    if (floating[static_cast<size_t>(op)]) continue;
    pos[static_cast<size_t>(op)] = static_cast<int64_t>(seq.size());
    seq.push_back(op);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (!floating[static_cast<size_t>(*it)]) continue;
    int64_t first = -1;
    for (TensorId t : g.op(*it).outputs) {
      for (OpId c : g.tensor(t).consumers) {
        const int64_t p = pos[static_cast<size_t>(c)];
        if (p >= 0 && (first < 0 || p < first)) first = p;
      }
    }
    pos[static_cast<size_t>(*it)] = first;
  }
  const size_t n = seq.size();

  // prefix[i]: compute of seq[0, i).
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[static_cast<size_t>(seq[i])];

  // crossing[i]: bytes of the tensors a cut before seq[i] would separate from
  // a reader, by a difference array over [producer's position + 1, last reader].
  std::vector<double> diff(n + 2, 0.0);
  for (const Tensor& t : g.tensors()) {
    if (t.producer == kNoOp) continue;
    const int64_t first = pos[static_cast<size_t>(t.producer)];
    int64_t last = -1;
    for (OpId c : t.consumers) last = std::max(last, pos[static_cast<size_t>(c)]);
    if (first < 0 || last <= first) continue;
    const auto bytes = static_cast<double>(planning_bytes(t, o.dynamic_hint));
    diff[static_cast<size_t>(first + 1)] += bytes;
    diff[static_cast<size_t>(last + 1)] -= bytes;
  }
  std::vector<double> crossing(n + 1, 0.0);
  for (size_t i = 1; i <= n; ++i) crossing[i] = crossing[i - 1] + diff[i];

  // cuts[k]: stage k + 1 starts at seq[cuts[k]].
  std::vector<size_t> cuts;
  const double total = prefix[n];
  const double share = total / stages;
  size_t lo_bound = 1;
  for (int k = 1; k < stages; ++k) {
    const size_t hi_bound =
        n >= static_cast<size_t>(stages - k) ? n - static_cast<size_t>(stages - k) : 0;
    if (n < 2 || lo_bound > hi_bound) {  // fewer ops than stages: later stages stay empty
      cuts.push_back(std::min(std::max(lo_bound, size_t{1}), n));
      lo_bound = cuts.back();
      continue;
    }
    const double target = share * k;
    const double slack = o.tolerance * share;
    auto at_least = [&](double v) {
      return static_cast<size_t>(std::lower_bound(prefix.begin(), prefix.end(), v) -
                                 prefix.begin());
    };
    const size_t from = std::clamp(at_least(target - slack), lo_bound, hi_bound);
    size_t best = n + 1;
    for (size_t i = from; i <= hi_bound && prefix[i] <= target + slack; ++i) {
      if (best > n || crossing[i] < crossing[best] ||
          (crossing[i] == crossing[best] &&
           std::abs(prefix[i] - target) < std::abs(prefix[best] - target))) {
        best = i;
      }
    }
    if (best > n) {  // no position within the window: the one closest to the target
      size_t i = std::clamp(at_least(target), lo_bound, hi_bound);
      if (i > lo_bound && std::abs(prefix[i - 1] - target) <= std::abs(prefix[i] - target)) --i;
      best = i;
    }
    cuts.push_back(best);
    lo_bound = best + 1;
  }

  PipelinePartition out;
  out.placement = Placement::unplaced(g);
  out.stage_cost.assign(static_cast<size_t>(stages), 0.0);
  out.stage_ops.assign(static_cast<size_t>(stages), 0);
  for (size_t k = 0; k < cuts.size(); ++k) {
    out.cut_bytes.push_back(static_cast<uint64_t>(crossing[std::min(cuts[k], n)]));
  }
  auto stage_at = [&](int64_t p) {  // cuts are increasing: count those at or before p
    if (p < 0) return 0;
    return static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), static_cast<size_t>(p)) -
                            cuts.begin());
  };
  for (OpId op : order) out.placement.set(op, stage_at(pos[static_cast<size_t>(op)]));
  for (OpId op : order) {
    if (g.op(op).type != "Variable") continue;
    for (TensorId t : g.op(op).outputs) {
      int first = -1, last = -1;
      for (OpId c : g.tensor(t).consumers) {
        const int s = out.placement.rank_of(c);
        first = first < 0 ? s : std::min(first, s);
        last = std::max(last, s);
      }
      if (last > first) out.shared_weights.push_back(t);
    }
  }
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const auto s = static_cast<size_t>(out.placement.rank[i]);
    out.stage_ops[s] += 1;
    out.stage_cost[s] += cost[i];
  }
  return out;
}

}  // namespace rdmaflow::graph
