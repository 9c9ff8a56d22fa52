// Partitioning and planning properties over a few hundred random DAGs with
// random placements, checked against brute force:
//  - every cross-rank edge is served by exactly one transfer per (tensor, rank);
//  - no two buffers of a rank that may be in use at the same time overlap,
//    where "may" is decided by explicit reachability over the whole job's
//    happens-before graph, not by the planner's own intervals;
//  - every slot and buffer fits and is aligned;
//  - the ranks' schedules run to completion together (no cross-rank wait cycle);
//  - planning is deterministic and the plan round-trips through JSON.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/partition.h"
#include "graph/plan_json.h"
#include "graph/schedule.h"
#include "graph/synthetic.h"
#include "graph/validate.h"

namespace rdmaflow::graph {
namespace {

constexpr int kGraphs = 300;

struct Case {
  GraphFile file;
  int ranks;
};

Case make_case(int i) {
  const int ranks = 1 + i % 5;
  const int ops = 1 + (i * 7919) % 60;
  return Case{synthetic::random_dag(static_cast<uint64_t>(i) + 1, ops, ranks), ranks};
}

// Exactly one transfer per (tensor, destination rank) that has a reader there,
// and the reader reads the Recv's output.
void check_partition(const Graph& g, const Placement& p, const PartitionedGraph& pg) {
  std::set<std::pair<TensorId, int>> needed;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const Tensor& tensor = g.tensors()[t];
    if (tensor.producer == kNoOp) continue;
    for (OpId c : tensor.consumers) {
      if (p.rank_of(c) != p.rank_of(tensor.producer)) {
        needed.emplace(static_cast<TensorId>(t), p.rank_of(c));
      }
    }
  }
  std::map<std::pair<TensorId, int>, int> served;
  for (const Edge& e : pg.transfers) {
    ++served[{e.tensor, e.dst_rank}];
    EXPECT_EQ(e.src_rank, p.rank_of(g.tensor(e.tensor).producer));
    const Graph& dg = pg.ranks[static_cast<size_t>(e.dst_rank)].graph;
    const Op& recv = dg.op(e.recv_op);
    ASSERT_EQ(recv.type, kRecvOpType);
    ASSERT_EQ(recv.outputs.size(), 1u);
    EXPECT_EQ(std::get<int64_t>(recv.attrs.at("transfer_id")), static_cast<int64_t>(e.id));
    const Op& send = pg.ranks[static_cast<size_t>(e.src_rank)].graph.op(e.send_op);
    EXPECT_EQ(send.type, kSendOpType);
    EXPECT_EQ(std::get<int64_t>(send.attrs.at("transfer_id")), static_cast<int64_t>(e.id));
    // Every reader of the tensor on the destination reads what the Recv produces.
    for (OpId c : dg.tensor(recv.outputs[0]).consumers) {
      EXPECT_EQ(dg.op(c).type == kSendOpType, false);
    }
  }
  EXPECT_EQ(served.size(), needed.size());
  for (const auto& [key, count] : served) {
    EXPECT_EQ(count, 1) << "tensor " << g.tensor(key.first).name << " -> rank " << key.second;
    EXPECT_TRUE(needed.count(key)) << "transfer without a reader";
  }
  // Each rank's subgraph is a valid graph; every original op is on its rank.
  size_t placed = 0;
  for (const RankGraph& rg : pg.ranks) {
    EXPECT_TRUE(validate(rg.graph)) << validate(rg.graph).to_string();
    for (OpId o : rg.original_op) {
      if (o == kNoOp) continue;
      ++placed;
      EXPECT_EQ(p.rank_of(o), rg.rank);
    }
  }
  EXPECT_EQ(placed, g.num_ops());
}

// Runs the ranks' schedules together: a rank advances past a Recv only after
// the matching Send ran. Fails if some rank can never proceed.
void check_runs_to_completion(const TransferPlan& plan) {
  std::vector<size_t> pc(plan.ranks.size(), 0);
  std::vector<bool> sent(plan.transfers.size(), false);
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      const auto& sched = plan.ranks[r].schedule;
      while (pc[r] < sched.size()) {
        const ScheduledOp& op = sched[pc[r]];
        if (op.kind == OpKind::kRecv && !sent[static_cast<size_t>(op.transfer)]) break;
        if (op.kind == OpKind::kSend) sent[static_cast<size_t>(op.transfer)] = true;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    EXPECT_EQ(pc[r], plan.ranks[r].schedule.size()) << "rank " << r << " is stuck";
  }
}

// Every local producer of an op's inputs runs before it.
void check_schedule_is_topological(const PartitionedGraph& pg, const TransferPlan& plan) {
  for (const RankGraph& rg : pg.ranks) {
    const auto& sched = plan.ranks[static_cast<size_t>(rg.rank)].schedule;
    ASSERT_EQ(sched.size(), rg.graph.num_ops());
    std::map<std::string, size_t> pos;
    for (size_t i = 0; i < sched.size(); ++i) pos[sched[i].name] = i;
    ASSERT_EQ(pos.size(), sched.size());
    for (const Op& op : rg.graph.ops()) {
      for (TensorId t : op.inputs) {
        const Op& producer = rg.graph.op(rg.graph.tensor(t).producer);
        EXPECT_LT(pos.at(producer.name), pos.at(op.name));
      }
    }
  }
}

// Brute-force happens-before over all ranks' ops: data edges, Send -> Recv
// edges and each rank's sequential order, closed transitively.
class HappensBefore {
 public:
  HappensBefore(const PartitionedGraph& pg, const TransferPlan& plan) {
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      for (const ScheduledOp& op : plan.ranks[r].schedule) {
        id_[{static_cast<int>(r), op.name}] = names_.size();
        names_.push_back(op.name);
      }
    }
    const size_t n = names_.size();
    std::vector<std::vector<size_t>> succ(n);
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      const auto& sched = plan.ranks[r].schedule;
      for (size_t i = 1; i < sched.size(); ++i) {
        succ[node(static_cast<int>(r), sched[i - 1].name)].push_back(
            node(static_cast<int>(r), sched[i].name));
      }
      const Graph& g = pg.ranks[r].graph;
      for (const Op& op : g.ops()) {
        for (TensorId t : op.inputs) {
          succ[node(static_cast<int>(r), g.op(g.tensor(t).producer).name)].push_back(
              node(static_cast<int>(r), op.name));
        }
      }
    }
    for (const TransferSpec& t : plan.transfers) {
      succ[node(t.src_rank, t.send_op)].push_back(node(t.dst_rank, t.recv_op));
    }
    reach_.assign(n, std::vector<bool>(n, false));
    for (size_t s = 0; s < n; ++s) {  // DFS from every node (graphs are small)
      std::vector<size_t> stack = succ[s];
      while (!stack.empty()) {
        size_t v = stack.back();
        stack.pop_back();
        if (reach_[s][v]) continue;
        reach_[s][v] = true;
        for (size_t w : succ[v]) stack.push_back(w);
      }
    }
  }
  size_t node(int rank, const std::string& op) const { return id_.at({rank, op}); }
  bool before(size_t a, size_t b) const { return reach_[a][b]; }

 private:
  std::map<std::pair<int, std::string>, size_t> id_;
  std::vector<std::string> names_;
  std::vector<std::vector<bool>> reach_;
};

// The ops that touch a buffer: who writes it, and everyone who reads it.
struct Access {
  size_t writer;
  std::vector<size_t> all;  // writer included
};

Access accesses(const PlannedBuffer& b, int rank, const PartitionedGraph& pg,
                const TransferPlan& plan, const HappensBefore& hb) {
  Access a;
  const TransferSpec& first = plan.transfers[b.transfers.at(0)];
  const RankGraph& rg = pg.ranks[static_cast<size_t>(rank)];
  const TensorId local = *rg.graph.find_tensor(b.tensor);
  if (b.kind == BufferKind::kOutput) {
    a.writer = hb.node(rank, first.producer);
    for (TransferId t : b.transfers) {  // the write has read it once the Recv completed
      a.all.push_back(hb.node(plan.transfers[t].dst_rank, plan.transfers[t].recv_op));
    }
  } else {
    a.writer = hb.node(first.src_rank, first.send_op);
    a.all.push_back(hb.node(rank, first.recv_op));
  }
  a.all.push_back(a.writer);
  for (OpId c : rg.graph.tensor(local).consumers)
    a.all.push_back(hb.node(rank, rg.graph.op(c).name));
  return a;
}

bool done_before(const Access& x, const Access& y, const HappensBefore& hb) {
  for (size_t op : x.all) {
    if (!hb.before(op, y.writer)) return false;
  }
  return true;
}

void check_memory_safety(const PartitionedGraph& pg, const TransferPlan& plan) {
  HappensBefore hb(pg, plan);
  for (const RankPlan& r : plan.ranks) {
    std::vector<Access> acc;
    for (const PlannedBuffer& b : r.buffers) acc.push_back(accesses(b, r.rank, pg, plan, hb));
    for (size_t i = 0; i < r.buffers.size(); ++i) {
      for (size_t j = i + 1; j < r.buffers.size(); ++j) {
        const Region& a = r.buffers[i].region;
        const Region& b = r.buffers[j].region;
        if (a.offset + a.size <= b.offset || b.offset + b.size <= a.offset) continue;
        EXPECT_TRUE(done_before(acc[i], acc[j], hb) || done_before(acc[j], acc[i], hb))
            << "rank " << r.rank << ": buffers of '" << r.buffers[i].tensor << "' and '"
            << r.buffers[j].tensor << "' share bytes but may be in use at the same time";
      }
    }
  }
}

void check_slots(const Graph& g, const TransferPlan& plan) {
  for (const TransferSpec& t : plan.transfers) {
    const Tensor& tensor = g.tensor(*g.find_tensor(t.tensor));
    auto bytes = static_bytes(tensor.dtype, tensor.shape);
    EXPECT_EQ(t.dynamic, !bytes.has_value());
    if (bytes) {
      EXPECT_EQ(t.bytes, *bytes);
    }
    for (const Region* r : {&t.recv_slot, &t.send_buffer}) {
      EXPECT_EQ(r->offset % plan.options.alignment, 0u);
      EXPECT_GE(r->size, t.bytes + t.meta_bytes);
    }
    EXPECT_LE(t.recv_slot.offset + t.recv_slot.size,
              plan.ranks[static_cast<size_t>(t.dst_rank)].frame_bytes);
    EXPECT_LE(t.send_buffer.offset + t.send_buffer.size,
              plan.ranks[static_cast<size_t>(t.src_rank)].frame_bytes);
    EXPECT_EQ(t.slots, plan.options.pipeline_depth);
  }
  for (const RankPlan& r : plan.ranks) {
    EXPECT_LE(r.frame_bytes, r.frame_bytes_without_reuse);
    EXPECT_EQ(r.registered_bytes, r.frame_bytes * r.copies);
  }
}

TEST(PlanProperties, RandomDagsWithRandomPlacements) {
  size_t transfers = 0, shared = 0;
  for (int i = 0; i < kGraphs; ++i) {
    SCOPED_TRACE("random graph " + std::to_string(i));
    Case c = make_case(i);
    const Graph& g = c.file.graph;
    ASSERT_TRUE(validate(g)) << validate(g).to_string();
    auto pg = partition(g, c.file.placement, c.ranks);
    ASSERT_TRUE(pg) << pg.status().to_string();
    check_partition(g, c.file.placement, *pg);
    PlanOptions opts;
    opts.pipeline_depth = 1 + static_cast<uint32_t>(i % 3);
    opts.alignment = uint64_t{1} << (i % 8);
    opts.dynamic_size_hint = 1000;
    auto plan = analyze(*pg, opts);
    ASSERT_TRUE(plan) << plan.status().to_string();
    EXPECT_TRUE(check_plan(*plan)) << check_plan(*plan).to_string();
    check_slots(g, *plan);
    check_schedule_is_topological(*pg, *plan);
    check_runs_to_completion(*plan);
    check_memory_safety(*pg, *plan);
    if (HasFailure()) return;

    // Deterministic: again from scratch, and from the graph's JSON round trip.
    const std::string text = write_plan_json(*plan);
    auto again = plan_transfers(g, c.file.placement, c.ranks, opts);
    ASSERT_TRUE(again);
    EXPECT_EQ(write_plan_json(*again), text);
    auto reloaded = parse_graph_json(write_graph_json(g, &c.file.placement));
    ASSERT_TRUE(reloaded) << reloaded.status().to_string();
    auto third = plan_transfers(reloaded->graph, reloaded->placement, c.ranks, opts);
    ASSERT_TRUE(third);
    EXPECT_EQ(plan_hash(*third), fnv1a64(text));
    // The plan reads back equal.
    auto parsed = parse_plan_json(text);
    ASSERT_TRUE(parsed) << parsed.status().to_string();
    EXPECT_TRUE(*parsed == *plan);
    EXPECT_EQ(write_plan_json(*parsed), text);

    transfers += plan->transfers.size();
    for (const RankPlan& r : plan->ranks) shared += r.frame_bytes < r.frame_bytes_without_reuse;
  }
  // The generator must actually exercise the interesting cases.
  EXPECT_GT(transfers, 1000u);
  EXPECT_GT(shared, 20u);
}

TEST(PlanProperties, WithoutReuseNothingIsShared) {
  Case c = make_case(42);
  PlanOptions opts;
  opts.reuse = false;
  auto plan = plan_transfers(c.file.graph, c.file.placement, c.ranks, opts);
  ASSERT_TRUE(plan);
  for (const RankPlan& r : plan->ranks) {
    EXPECT_EQ(r.frame_bytes, r.frame_bytes_without_reuse);
  }
}

TEST(PlanProperties, NotifyEncodesTransferAndStep) {
  static_assert(make_notify(3, 7) == ((uint64_t{3} << 32) | 7));
  static_assert(notify_transfer(make_notify(0xfffffffe, 1)) == 0xfffffffe);
  static_assert(notify_step(make_notify(5, (uint64_t{1} << 32) + 9)) == 9);
  EXPECT_EQ(hash_hex(0x0123456789abcdefull), "0x0123456789abcdef");
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}

TEST(PlanProperties, BadOptionsAreRefused) {
  Case c = make_case(7);
  for (auto mutate : std::vector<void (*)(PlanOptions&)>{
           [](PlanOptions& o) { o.pipeline_depth = 0; },
           [](PlanOptions& o) { o.pipeline_depth = 65; },
           [](PlanOptions& o) { o.alignment = 48; },
           [](PlanOptions& o) { o.alignment = 0; },
           [](PlanOptions& o) { o.meta_bytes = 12; },
       }) {
    PlanOptions o;
    mutate(o);
    EXPECT_FALSE(plan_transfers(c.file.graph, c.file.placement, c.ranks, o));
  }
  EXPECT_FALSE(plan_transfers(c.file.graph, c.file.placement, kMaxRanks + 1));
}

TEST(PlanProperties, DamagedPlansAreRefused) {
  Case c = make_case(11);
  auto plan = plan_transfers(c.file.graph, c.file.placement, c.ranks);
  ASSERT_TRUE(plan);
  ASSERT_FALSE(plan->transfers.empty());
  {
    TransferPlan p = *plan;  // a slot that overlaps a live neighbour
    for (RankPlan& r : p.ranks) {
      if (r.buffers.size() < 2) continue;
      for (PlannedBuffer& b : r.buffers) b.region.offset = 0;
      for (PlannedBuffer& b : r.buffers) b.live_begin = -1, b.live_end = 1;
    }
    EXPECT_FALSE(check_plan(p));
  }
  {
    TransferPlan p = *plan;
    p.transfers[0].recv_slot.offset += 1;  // misaligned
    EXPECT_FALSE(check_plan(p));
  }
  {
    TransferPlan p = *plan;
    p.transfers[0].recv_slot.size = 0;  // too small
    EXPECT_FALSE(check_plan(p));
  }
  {
    TransferPlan p = *plan;
    p.ranks.pop_back();
    EXPECT_FALSE(check_plan(p));
  }
  std::string text = write_plan_json(*plan);
  for (size_t n = 0; n < text.size(); n += 1 + text.size() / 300) {
    EXPECT_FALSE(parse_plan_json(text.substr(0, n))) << "prefix " << n;
  }
}

}  // namespace
}  // namespace rdmaflow::graph
