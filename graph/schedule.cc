#include "graph/schedule.h"

#include <functional>
#include <queue>

namespace rdmaflow::graph {

namespace {

enum class Kind : uint8_t { kCompute, kSend, kRecv };

}  // namespace

Result<Schedule> make_schedule(const PartitionedGraph& pg) {
  const size_t R = pg.ranks.size();
  std::vector<size_t> base(R + 1, 0);
  for (size_t r = 0; r < R; ++r) base[r + 1] = base[r] + pg.ranks[r].graph.num_ops();
  const size_t N = base[R];

  auto kind_of = [&](size_t r, OpId op) {
    int64_t t = pg.ranks[r].transfer_of_op[static_cast<size_t>(op)];
    if (t < 0) return Kind::kCompute;
    const Edge& e = pg.transfers[static_cast<size_t>(t)];
    return (static_cast<size_t>(e.src_rank) == r && e.send_op == op) ? Kind::kSend : Kind::kRecv;
  };
  // The node a non-Recv op waits for when it reads local tensor `t` on rank r:
  // the producer, or for a received tensor the Send on the source rank.
  auto pred_of = [&](size_t r, TensorId t) -> int64_t {
    const RankGraph& rg = pg.ranks[r];
    OpId p = rg.graph.tensor(t).producer;
    if (p == kNoOp) return -1;
    if (kind_of(r, p) != Kind::kRecv) return static_cast<int64_t>(base[r]) + p;
    const Edge& e = pg.transfers[static_cast<size_t>(rg.transfer_of_op[static_cast<size_t>(p)])];
    return static_cast<int64_t>(base[static_cast<size_t>(e.src_rank)]) + e.send_op;
  };

  std::vector<int32_t> rank_of(N);
  std::vector<Kind> kind(N);
  std::vector<int32_t> indegree(N, 0);
  std::vector<int64_t> stamp(N, -1);
  for (size_t r = 0; r < R; ++r) {
    const Graph& g = pg.ranks[r].graph;
    for (size_t i = 0; i < g.num_ops(); ++i) {
      const size_t node = base[r] + i;
      rank_of[node] = static_cast<int32_t>(r);
      kind[node] = kind_of(r, static_cast<OpId>(i));
      if (kind[node] == Kind::kRecv) continue;
      for (TensorId t : g.ops()[i].inputs) {
        int64_t p = pred_of(r, t);
        if (p < 0 || stamp[static_cast<size_t>(p)] == static_cast<int64_t>(node)) continue;
        stamp[static_cast<size_t>(p)] = static_cast<int64_t>(node);
        ++indegree[node];
      }
    }
  }

  // Ready non-Recv ops: Sends first (by transfer id), then ops in file order.
  auto priority = [&](size_t node) -> int64_t {
    const size_t r = static_cast<size_t>(rank_of[node]);
    const auto op = static_cast<size_t>(node - base[r]);
    if (kind[node] == Kind::kSend) return pg.ranks[r].transfer_of_op[op];
    return (int64_t{1} << 40) + pg.ranks[r].original_op[op];
  };
  using Item = std::pair<int64_t, size_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (size_t n = 0; n < N; ++n) {
    if (kind[n] != Kind::kRecv && indegree[n] == 0) ready.emplace(priority(n), n);
  }

  Schedule s;
  s.order.resize(R);
  s.position.resize(R);
  for (size_t r = 0; r < R; ++r) s.position[r].assign(pg.ranks[r].graph.num_ops(), -1);
  s.global.reserve(N);
  auto emit = [&](size_t r, OpId op) {
    s.position[r][static_cast<size_t>(op)] = static_cast<int32_t>(s.order[r].size());
    s.order[r].push_back(op);
    s.global.emplace_back(static_cast<int32_t>(r), op);
  };
  std::fill(stamp.begin(), stamp.end(), -1);
  auto release = [&](size_t succ, size_t from) {
    if (stamp[succ] == static_cast<int64_t>(from)) return;
    stamp[succ] = static_cast<int64_t>(from);
    if (--indegree[succ] == 0) ready.emplace(priority(succ), succ);
  };
  while (!ready.empty()) {
    const size_t node = ready.top().second;
    ready.pop();
    const size_t r = static_cast<size_t>(rank_of[node]);
    const Graph& g = pg.ranks[r].graph;
    const auto op = static_cast<OpId>(node - base[r]);
    // Recvs feeding this op go right before it.
    for (TensorId t : g.op(op).inputs) {
      OpId p = g.tensor(t).producer;
      if (p != kNoOp && s.position[r][static_cast<size_t>(p)] < 0) emit(r, p);
    }
    emit(r, op);
    if (kind[node] == Kind::kSend) {
      const Edge& e = pg.transfers[static_cast<size_t>(pg.ranks[r].transfer_of_op[op])];
      const size_t d = static_cast<size_t>(e.dst_rank);
      const Graph& dg = pg.ranks[d].graph;
      for (TensorId t : dg.op(e.recv_op).outputs) {
        for (OpId c : dg.tensor(t).consumers) release(base[d] + static_cast<size_t>(c), node);
      }
      continue;
    }
    for (TensorId t : g.op(op).outputs) {
      for (OpId c : g.tensor(t).consumers) release(base[r] + static_cast<size_t>(c), node);
    }
  }
  // Recvs nobody reads (not made by partition(), but harmless) go last.
  for (size_t r = 0; r < R; ++r) {
    for (size_t i = 0; i < pg.ranks[r].graph.num_ops(); ++i) {
      if (s.position[r][i] < 0 && kind[base[r] + i] == Kind::kRecv) {
        const Edge& e = pg.transfers[static_cast<size_t>(pg.ranks[r].transfer_of_op[i])];
        if (s.position[static_cast<size_t>(e.src_rank)][static_cast<size_t>(e.send_op)] >= 0) {
          emit(r, static_cast<OpId>(i));
        }
      }
    }
  }
  if (s.global.size() != N) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "schedule graph", -1,
                          "the partitioned graph has a cycle (through a Send/Recv pair)");
  }
  return s;
}

}  // namespace rdmaflow::graph
