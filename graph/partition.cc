#include "graph/partition.h"

#include <algorithm>
#include <bit>
#include <type_traits>
#include <utility>
#include <variant>

#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/validate.h"

namespace rdmaflow::graph {

namespace {
constexpr const char* kPartition = "partition graph";

// Local id of original tensor `t` on `rank` (the holders list is tiny).
TensorId local_id(const std::vector<std::pair<int, TensorId>>& holders, int rank) {
  for (const auto& [r, id] : holders) {
    if (r == rank) return id;
  }
  return -1;
}
}  // namespace

std::string send_op_name(const std::string& tensor, int dst) {
  return "send:" + tensor + ":to:" + std::to_string(dst);
}

std::string recv_op_name(const std::string& tensor, int src) {
  return "recv:" + tensor + ":from:" + std::to_string(src);
}

uint64_t graph_fingerprint(const Graph& g, const Placement& p) {
  Fnv1a h;
  h.add(g.name);
  h.add_u64(g.num_tensors());
  for (const Tensor& t : g.tensors()) {
    h.add(t.name);
    h.add_u64(static_cast<uint64_t>(t.dtype));
    h.add_u64(t.shape.size());
    for (int64_t d : t.shape) h.add_u64(static_cast<uint64_t>(d));
    h.add_u64(t.size_hint);
  }
  h.add_u64(g.num_ops());
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const Op& op = g.ops()[i];
    h.add(op.name);
    h.add(op.type);
    h.add_u64(op.attrs.size());
    for (const auto& [key, value] : op.attrs) {
      h.add(key);
      h.add_u64(value.index());
      std::visit(
          [&h](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>) {
              h.add(v);
            } else if constexpr (std::is_same_v<V, double>) {
              h.add_u64(std::bit_cast<uint64_t>(v));
            } else if constexpr (std::is_same_v<V, bool> || std::is_same_v<V, int64_t>) {
              h.add_u64(static_cast<uint64_t>(v));
            } else {
              h.add_u64(v.size());
              for (const auto& e : v) {
                if constexpr (std::is_same_v<std::decay_t<decltype(e)>, std::string>) {
                  h.add(e);
                } else if constexpr (std::is_same_v<std::decay_t<decltype(e)>, double>) {
                  h.add_u64(std::bit_cast<uint64_t>(e));
                } else {
                  h.add_u64(static_cast<uint64_t>(e));
                }
              }
            }
          },
          value);
    }
    h.add_u64(op.inputs.size());
    for (TensorId t : op.inputs) h.add_u64(static_cast<uint64_t>(t));
    h.add_u64(op.outputs.size());
    for (TensorId t : op.outputs) h.add_u64(static_cast<uint64_t>(t));
    h.add_u64(i < p.rank.size() ? static_cast<uint64_t>(p.rank[i]) : ~uint64_t{0});
    h.add(i < p.device.size() ? p.device[i] : std::string());
  }
  return h.value();
}

Result<PartitionedGraph> partition(const Graph& g, const Placement& placement, int num_ranks) {
  if (num_ranks > kMaxRanks) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kPartition, -1,
                          std::to_string(num_ranks) + " ranks; at most " +
                              std::to_string(kMaxRanks) + " are supported");
  }
  RDMAFLOW_RETURN_IF_ERROR(validate(g));
  RDMAFLOW_RETURN_IF_ERROR(validate_placement(g, placement, num_ranks));

  PartitionedGraph pg;
  pg.original = &g;
  pg.num_ranks = num_ranks;
  pg.graph_hash = graph_fingerprint(g, placement);
  pg.ranks.resize(static_cast<size_t>(num_ranks));
  for (int r = 0; r < num_ranks; ++r) {
    RankGraph& rg = pg.ranks[static_cast<size_t>(r)];
    rg.rank = r;
    rg.graph.name =
        g.name.empty() ? "rank" + std::to_string(r) : g.name + "/rank" + std::to_string(r);
  }

  // Size each rank's graph up front: its ops, the tensors it touches (at most
  // its ops' inputs and outputs), and one Send/Recv per crossing edge at most.
  {
    std::vector<size_t> ops(static_cast<size_t>(num_ranks), 0), tensors(ops);
    for (size_t i = 0; i < g.num_ops(); ++i) {
      const Op& op = g.ops()[i];
      const auto r = static_cast<size_t>(placement.rank[i]);
      ops[r] += 1 + op.inputs.size();
      tensors[r] += op.inputs.size() + op.outputs.size();
    }
    for (size_t r = 0; r < ops.size(); ++r) pg.ranks[r].graph.reserve(ops[r], tensors[r]);
  }

  // Every rank that touches a tensor (its producer's and its readers') holds a
  // local copy of the declaration; remember each copy's local id.
  std::vector<std::vector<std::pair<int, TensorId>>> holders(g.num_tensors());
  std::vector<int> dst_ranks;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const Tensor& tensor = g.tensors()[t];
    auto& h = holders[t];
    auto hold = [&](int r) {
      if (local_id(h, r) >= 0) return Status::ok();
      RankGraph& rg = pg.ranks[static_cast<size_t>(r)];
      auto id = rg.graph.add_tensor(tensor.name, tensor.dtype, tensor.shape, tensor.size_hint);
      if (!id) return id.status().with_op(kPartition);
      rg.original_tensor.push_back(static_cast<TensorId>(t));
      h.emplace_back(r, *id);
      return Status::ok();
    };
    if (tensor.producer != kNoOp)
      RDMAFLOW_RETURN_IF_ERROR(hold(placement.rank_of(tensor.producer)));
    for (OpId c : tensor.consumers) RDMAFLOW_RETURN_IF_ERROR(hold(placement.rank_of(c)));
  }

  // Original ops, in file order, on their ranks.
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const Op& op = g.ops()[i];
    int r = placement.rank[i];
    RankGraph& rg = pg.ranks[static_cast<size_t>(r)];
    std::vector<TensorId> in, out;
    in.reserve(op.inputs.size());
    out.reserve(op.outputs.size());
    for (TensorId t : op.inputs) in.push_back(local_id(holders[static_cast<size_t>(t)], r));
    for (TensorId t : op.outputs) out.push_back(local_id(holders[static_cast<size_t>(t)], r));
    auto id = rg.graph.add_op_ids(op.name, op.type, std::move(in), std::move(out), op.attrs);
    if (!id) return id.status().with_op(kPartition);
    rg.device.push_back(placement.device[i]);
    rg.original_op.push_back(static_cast<OpId>(i));
    rg.transfer_of_op.push_back(-1);
  }

  // One transfer per (tensor, destination rank).
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const Tensor& tensor = g.tensors()[t];
    if (tensor.producer == kNoOp) continue;
    const int src = placement.rank_of(tensor.producer);
    dst_ranks.clear();
    for (OpId c : tensor.consumers) {
      int d = placement.rank_of(c);
      if (d != src) dst_ranks.push_back(d);
    }
    std::sort(dst_ranks.begin(), dst_ranks.end());
    dst_ranks.erase(std::unique(dst_ranks.begin(), dst_ranks.end()), dst_ranks.end());
    for (int dst : dst_ranks) {
      Edge e;
      e.id = static_cast<TransferId>(pg.transfers.size());
      e.tensor = static_cast<TensorId>(t);
      e.src_rank = src;
      e.dst_rank = dst;
      Attributes send_attrs{{"transfer_id", static_cast<int64_t>(e.id)},
                            {"peer", static_cast<int64_t>(dst)}};
      Attributes recv_attrs{{"transfer_id", static_cast<int64_t>(e.id)},
                            {"peer", static_cast<int64_t>(src)}};
      RankGraph& s = pg.ranks[static_cast<size_t>(src)];
      auto send = s.graph.add_op_ids(send_op_name(tensor.name, dst), kSendOpType,
                                     {local_id(holders[t], src)}, {}, std::move(send_attrs));
      if (!send) return send.status().with_op(kPartition);
      s.device.push_back(placement.device[static_cast<size_t>(tensor.producer)]);
      s.original_op.push_back(kNoOp);
      s.transfer_of_op.push_back(e.id);
      RankGraph& d = pg.ranks[static_cast<size_t>(dst)];
      auto recv = d.graph.add_op_ids(recv_op_name(tensor.name, src), kRecvOpType, {},
                                     {local_id(holders[t], dst)}, std::move(recv_attrs));
      if (!recv) return recv.status().with_op(kPartition);
      for (OpId c : tensor.consumers) {  // the Recv runs where its first reader runs
        if (placement.rank_of(c) == dst) {
          d.device.push_back(placement.device[static_cast<size_t>(c)]);
          break;
        }
      }
      d.original_op.push_back(kNoOp);
      d.transfer_of_op.push_back(e.id);
      e.send_op = *send;
      e.recv_op = *recv;
      pg.transfers.push_back(e);
    }
  }
  return pg;
}

}  // namespace rdmaflow::graph
