#include "graph/liveness.h"

#include <algorithm>
#include <limits>

namespace rdmaflow::graph {

namespace {

constexpr int32_t kNever = std::numeric_limits<int32_t>::max();

// Per transfer: the last op on the destination rank that happens before the
// Send, and the first op on the source rank that happens after the Recv.
struct Clocks {
  std::vector<int32_t> dst_before_send;
  std::vector<int32_t> src_after_recv;
};

Clocks vector_clocks(const PartitionedGraph& pg, const Schedule& s) {
  const size_t R = pg.ranks.size();
  const size_t T = pg.transfers.size();
  Clocks c;
  c.dst_before_send.assign(T, -1);
  c.src_after_recv.assign(T, kNever);

  auto transfer_at = [&](int32_t r, OpId op) {
    return pg.ranks[static_cast<size_t>(r)].transfer_of_op[static_cast<size_t>(op)];
  };
  auto is_send = [&](int32_t r, OpId op, int64_t t) {
    const Edge& e = pg.transfers[static_cast<size_t>(t)];
    return e.src_rank == r && e.send_op == op;
  };

  // Forward: clock[r][k] = last position on rank k that happens before (or is)
  // rank r's current op.
  {
    std::vector<std::vector<int32_t>> clock(R, std::vector<int32_t>(R, -1));
    std::vector<std::vector<int32_t>> at_send(T);
    for (const auto& [r, op] : s.global) {
      auto& mine = clock[static_cast<size_t>(r)];
      int64_t t = transfer_at(r, op);
      if (t >= 0 && !is_send(r, op, t)) {
        auto& snap = at_send[static_cast<size_t>(t)];
        for (size_t k = 0; k < R && !snap.empty(); ++k) mine[k] = std::max(mine[k], snap[k]);
        std::vector<int32_t>().swap(snap);
      }
      mine[static_cast<size_t>(r)] = s.position[static_cast<size_t>(r)][static_cast<size_t>(op)];
      if (t >= 0 && is_send(r, op, t)) {
        const Edge& e = pg.transfers[static_cast<size_t>(t)];
        c.dst_before_send[static_cast<size_t>(t)] = mine[static_cast<size_t>(e.dst_rank)];
        at_send[static_cast<size_t>(t)] = mine;
      }
    }
  }
  // Backward: clock[r][k] = first position on rank k that happens after (or is)
  // rank r's current op.
  {
    std::vector<std::vector<int32_t>> clock(R, std::vector<int32_t>(R, kNever));
    std::vector<std::vector<int32_t>> at_recv(T);
    for (auto it = s.global.rbegin(); it != s.global.rend(); ++it) {
      const auto [r, op] = *it;
      auto& mine = clock[static_cast<size_t>(r)];
      int64_t t = transfer_at(r, op);
      if (t >= 0 && is_send(r, op, t)) {
        auto& snap = at_recv[static_cast<size_t>(t)];
        for (size_t k = 0; k < R && !snap.empty(); ++k) mine[k] = std::min(mine[k], snap[k]);
        std::vector<int32_t>().swap(snap);
      }
      mine[static_cast<size_t>(r)] = s.position[static_cast<size_t>(r)][static_cast<size_t>(op)];
      if (t >= 0 && !is_send(r, op, t)) {
        const Edge& e = pg.transfers[static_cast<size_t>(t)];
        c.src_after_recv[static_cast<size_t>(t)] = mine[static_cast<size_t>(e.src_rank)];
        at_recv[static_cast<size_t>(t)] = mine;
      }
    }
  }
  return c;
}

}  // namespace

std::vector<RankLiveness> cross_rank_liveness(const PartitionedGraph& pg, const Schedule& s) {
  const size_t R = pg.ranks.size();
  Clocks clocks = vector_clocks(pg, s);
  std::vector<RankLiveness> out(R);
  for (size_t r = 0; r < R; ++r) {
    out[r].num_positions = static_cast<int32_t>(s.order[r].size());
  }
  auto pos = [&](size_t r, OpId op) { return s.position[r][static_cast<size_t>(op)]; };

  // Output buffers: one per sent tensor (its transfers are consecutive ids).
  for (size_t i = 0; i < pg.transfers.size();) {
    const Edge& first = pg.transfers[i];
    const auto r = static_cast<size_t>(first.src_rank);
    const RankGraph& rg = pg.ranks[r];
    const Graph& g = rg.graph;
    const TensorId local = g.op(first.send_op).inputs[0];
    BufferLife b;
    b.kind = BufferKind::kOutput;
    b.tensor = first.tensor;
    b.transfer = first.id;
    b.begin = pos(r, g.tensor(local).producer);
    int32_t end = b.begin + 1;
    for (OpId c : g.tensor(local).consumers) end = std::max(end, pos(r, c) + 1);  // Sends too
    size_t j = i;
    for (; j < pg.transfers.size() && pg.transfers[j].tensor == first.tensor; ++j) {
      int32_t after = clocks.src_after_recv[j];
      end = std::max(end, after == kNever ? out[r].num_positions : after);
    }
    b.end = std::min(end, out[r].num_positions);
    out[r].buffers.push_back(b);
    i = j;
  }
  // Receive slots.
  for (const Edge& e : pg.transfers) {
    const auto r = static_cast<size_t>(e.dst_rank);
    const Graph& g = pg.ranks[r].graph;
    BufferLife b;
    b.kind = BufferKind::kSlot;
    b.tensor = e.tensor;
    b.transfer = e.id;
    b.begin = clocks.dst_before_send[e.id];
    int32_t end = pos(r, e.recv_op) + 1;
    for (OpId c : g.tensor(g.op(e.recv_op).outputs[0]).consumers) {
      end = std::max(end, pos(r, c) + 1);
    }
    b.end = end;
    out[r].buffers.push_back(b);
  }
  return out;
}

}  // namespace rdmaflow::graph
