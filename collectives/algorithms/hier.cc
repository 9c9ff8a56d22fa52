// Hierarchical allreduce, two levels as NCCL runs it between nodes: the ranks
// of a host reduce-scatter the buffer among themselves (a ring within the
// host; local rank i ends with block i of per_host blocks, reduced over the
// host), then lane i (local rank i of every host) allreduces block i between
// the hosts, then the ranks of a host allgather the blocks (a ring). The
// per_host lanes run between the hosts at once, each on its own connections,
// so every local rank carries its share of the host's traffic rather than
// one leader carrying all of it. A host's link carries 2(H-1)/H of the buffer
// each way (H hosts); a flat ring over the n ranks carries 2(n-1)/n of it
// across each host boundary it passes.
//
// The lanes' algorithm is the cost model's choice for the block on links
// that all lanes share, by its path (CostModel::between_hosts): on 2 hosts
// recursive doubling, one exchange each way at once. Each phase is a
// sub-collective built by its own schedule in a group of ranks
// (build_in_group); the Program's buffer dependencies join them, so a piece
// of block i leaves for the other hosts as soon as the host has reduced it.
//
// What it costs (docs/benchmarks.md, "Profile at c3c16a9"): the phases do
// overlap (on 2 x 2 at 16 MiB the lane's first piece leaves about 1 ms into a
// 23 ms call, and the allgather runs while the lane still sends), so chunking
// the phases by hand would add nothing. Summed over a host's ranks, hier does
// the memory work of the tree in host order (puts into slots, copies out of
// them, reductions: about ten buffers' worth on 2 x 2 for both) and moves the
// same bytes over the link; what it saves is the busiest rank's share (the
// tree's root reduces and sends twice what any hier rank does). So it wins
// where ranks have cores of their own, and ties the tree where ranks share
// them (4 ranks on 2 cores). Ring or tree lanes, which reduce each final
// block once instead of at both ends, measured no better.
//
// Layouts without two levels run a flat schedule, which the cost model never
// prefers to the flat algorithms themselves (hier costs +inf there): one host,
// the ring within it (the flat ring); one rank per host, the lanes' algorithm
// over all ranks; hosts with different numbers of ranks, a flat ring.
#include <limits>
#include <vector>

#include "collectives/algorithms/parts.h"
#include "collectives/algorithms/registry.h"

namespace rdmaflow {

void ring_allreduce(const CollArgs& a, Program& p);  // ring.cc

namespace {

bool has_levels(const CollArgs& a) {
  return a.hosts != nullptr && a.hosts->hosts() > 1 && a.hosts->per_host() > 0;
}

// The lanes' algorithm of hier's `kind` for a call of `bytes` (the call's
// largest buffer), as the builders choose it: each of the per_host lanes
// carries its share; the barrier's lane is a dissemination (hier_ops.cc).
Algorithm lane_choice(const CostModel& m, CollectiveKind kind, size_t bytes) {
  if (kind == CollectiveKind::kBarrier) return Algorithm::kDissemination;
  return m.between_hosts(kind, bytes / static_cast<size_t>(m.per_host()));
}

// Phase 2 of this rank: the allreduce of its block among its lane.
struct LanePhase {
  CollArgs args;
  Algorithm algo = Algorithm::kRing;
  std::vector<int> ranks;
};

LanePhase lane_phase(const CollArgs& a) {
  const HostGroups& g = *a.hosts;
  const int q = g.per_host(), local = g.local_rank(a.rank);
  const BlockRange mine = block_range(a.count, static_cast<size_t>(q), static_cast<size_t>(local));
  LanePhase lp;
  lp.args = a;
  lp.args.in = a.out_at(mine.begin);
  lp.args.out = a.out_at(mine.begin);
  lp.args.count = mine.size;
  lp.args.rank = g.host_of(a.rank);
  lp.args.world = g.hosts();
  // hier scales kAvg itself, once the block is reduced over every rank.
  if (a.op == ReduceOp::kAvg) lp.args.op = ReduceOp::kSum;
  lp.ranks = g.lane(local);
  lp.algo = lane_algorithm(a, CollectiveKind::kAllreduce, mine.size * a.es());
  return lp;
}

}  // namespace

Algorithm lane_algorithm(const CollArgs& a, CollectiveKind kind, size_t bytes) {
  Algorithm algo = Algorithm::kRing;
  if (a.model != nullptr) {
    algo =
        a.model->two_level() ? a.model->between_hosts(kind, bytes) : a.model->choose(kind, bytes);
  }
  if (algo == Algorithm::kHier || algo == Algorithm::kAuto || !algorithm_supports(algo, kind)) {
    algo = Algorithm::kRing;
  }
  return algo;
}

void hier_allreduce(const CollArgs& a, Program& p) {
  if (!has_levels(a)) return ring_allreduce(a, p);
  const HostGroups& g = *a.hosts;
  const std::span<const int> host = g.ranks(g.host_of(a.rank));
  CollArgs within = a;
  within.rank = g.local_rank(a.rank);
  within.world = g.per_host();
  build_in_group(within, ring_reduce_scatter_blocks, host, p);
  const LanePhase lane = lane_phase(a);
  if (lane.args.count > 0) {
    build_in_group(
        lane.args,
        find_algorithm(lane.algo)->build[static_cast<size_t>(CollectiveKind::kAllreduce)],
        lane.ranks, p);
    if (a.op == ReduceOp::kAvg) p.scale(lane.args.out, lane.args.count);
  }
  build_in_group(within, ring_allgather_blocks, host, p);
}

size_t hier_scratch(const CollArgs& a) {
  if (a.kind != CollectiveKind::kAllreduce) return hier_ops_scratch(a);
  if (!has_levels(a)) return 0;
  const LanePhase lane = lane_phase(a);
  return temp_elems(lane.args, lane.algo);
}

// Every kind is costed phase by phase (CostModel::hier_estimate) with the
// lanes' algorithm the builders take for the same bytes.
double hier_rounds(CollectiveKind kind, const CostTerms& t) {
  if (t.model == nullptr || !t.model->two_level()) return 0;
  const CostModel& m = *t.model;
  const auto bytes = static_cast<size_t>(t.m);
  return m.hier_estimate(kind, lane_choice(m, kind, bytes), bytes).rounds;
}

// Auto leaves hier's broadcast and reduce alone: their lanes move as many
// bytes over a host's link as the flat chain or binomial tree does when the
// ranks are numbered host by host (as launchers number them), and hier adds
// the phases within the host. The model costs every hop of a flat algorithm
// at the link's rate (it does not know the numbering), so it would credit
// hier with a gain that is not there: on 2 hosts x 2 ranks hier's broadcast
// measured 0.79-0.95x and its reduce 0.5-0.96x of the best flat algorithm
// (docs/benchmarks.md, "Hierarchical collectives"). Forced, they run.
double hier_cost(CollectiveKind kind, const CostTerms& t) {
  if (kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce) {
    return std::numeric_limits<double>::infinity();
  }
  if (t.model == nullptr || !t.model->two_level()) return std::numeric_limits<double>::infinity();
  const CostModel& m = *t.model;
  const auto bytes = static_cast<size_t>(t.m);
  return m.hier_estimate(kind, lane_choice(m, kind, bytes), bytes).seconds;
}

}  // namespace rdmaflow

namespace rdmaflow {

// Allreduce on two levels: within each of the H hosts a ring reduce-scatter
// and allgather among its q ranks (2(q - 1) steps of m/q from every rank),
// between the hosts the q lanes' allreduces of m/q, each the lanes'
// algorithm's sends over H ranks. The chain: the reduce-scatter's and the
// allgather's steps within the host, and a lane's chain with the host's q
// lanes on its link at once.
Work hier_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce || t.model == nullptr || !t.model->two_level()) return w;
  const CostModel& m = *t.model;
  const double hosts = m.hosts(), q = m.per_host();
  const double steps = 2 * (q - 1) * q * hosts;
  w.add(false, steps * t.pieces(t.m / q), steps * t.m / q);  // reduce-scatter: (q - 1) m reduced
  const auto bytes = static_cast<size_t>(t.m);
  const AlgorithmInfo* lane = find_algorithm(lane_choice(m, kind, bytes));
  if (lane == nullptr || lane->work == nullptr) return Work{};
  const CostModel lanes(m.hosts(), m.params());
  CostTerms lane_terms = lanes.terms(bytes / static_cast<size_t>(q));
  lane_terms.k = t.k;  // the lanes run in the call's pieces
  const Work one = lane->work(kind, lane_terms);
  w.add(true, q * one.messages, q * one.bytes);
  w.reduced = hosts * (q - 1) * t.m + q * one.reduced;
  w.copied = hosts * (q - 1) * t.m + q * one.copied;  // the allgather's blocks within the host
  w.host_chain = 2 * (q - 1) * std::min(t.m / q, t.k) + q * one.host_chain;
  w.chain = q * one.chain;
  return w;
}

}  // namespace rdmaflow
