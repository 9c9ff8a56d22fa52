// Hierarchical reduce_scatter, allgather, broadcast, reduce and barrier, in the
// shape of hier's allreduce (hier.cc): the ranks of a host work through
// shared memory, and between the hosts every local rank l runs a collective
// with the local ranks l of the other hosts (lane l) on its own connections,
// so the host's link carries per_host lanes' shares at once rather than one
// leader's whole buffer.
//
//   reduce_scatter  a ring within the host over lane groups: local rank l ends
//                   with the blocks of lane l's ranks (one per host), reduced
//                   over the host, packed in tmp; lane l reduce-scatters them.
//   allgather       lane l allgathers its ranks' blocks into tmp (the link
//                   carries each block once per host), then a ring within the
//                   host passes the lane groups to every local rank.
//   broadcast       the root scatters the buffer over its host (piece l to
//                   local rank l), lane l broadcasts piece l from the root's
//                   host, each host allgathers the pieces (a ring).
//   reduce          a ring reduce-scatter within the host (piece l at local
//                   rank l), lane l reduces piece l to the root's host, which
//                   gathers the pieces at the root.
//   barrier         dissemination within the host, then on lane 0 between the
//                   hosts, then within the host again (its ranks leave once
//                   local rank 0 is through the lane).
//
// A rank's blocks of a reduce_scatter or allgather sit at rank * count, and a
// lane's ranks need not be neighbours (hosts may interleave their ranks), so
// the rings within the host send a lane group as one message per host rather
// than copying it together first.
//
// Layouts without two levels (one host, one rank per host, hosts of different
// sizes) run the flat ring (dissemination for the barrier), which the cost
// model never prefers to the flat algorithms themselves: hier costs +inf there.
#include <vector>

#include "collectives/algorithms/parts.h"
#include "collectives/algorithms/registry.h"

namespace rdmaflow {

// ring.cc, dissemination.cc
void ring_reduce_scatter(const CollArgs& a, Program& p);
void ring_allgather(const CollArgs& a, Program& p);
void ring_broadcast(const CollArgs& a, Program& p);
void ring_reduce(const CollArgs& a, Program& p);
size_t ring_scratch(const CollArgs& a);
void dissemination_barrier(const CollArgs& a, Program& p);
size_t dissemination_scratch(const CollArgs& a);

namespace {

using K = CollectiveKind;

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

bool two_levels(const CollArgs& a) {
  return a.hosts != nullptr && a.hosts->hierarchical();
}

// This rank's place in the two levels.
struct Levels {
  explicit Levels(const CollArgs& a)
      : g(*a.hosts),
        host(g.host_of(a.rank)),
        local(g.local_rank(a.rank)),
        hosts(g.hosts()),
        q(g.per_host()),
        members(g.ranks(host)),
        lane(g.lane(local)) {}
  const HostGroups& g;
  int host, local, hosts, q;
  std::span<const int> members;  // this host's ranks, by local rank
  std::vector<int> lane;         // lane `local`'s ranks, by host
  // The real rank of local rank `l` on host `h`.
  int rank_at(int h, int l) const { return g.ranks(h)[static_cast<size_t>(l)]; }
};

CollArgs within_args(const CollArgs& a, const Levels& l) {
  CollArgs w = a;
  w.rank = l.local;
  w.world = l.q;
  return w;
}

// The lane phase of this rank: its arguments (a collective among the lane,
// this rank being lane rank `host`) and algorithm. Its scratch follows the
// `tmp_before` elements of tmp the other phases use.
struct LanePlan {
  CollArgs args;
  Algorithm algo = Algorithm::kRing;
  size_t tmp_before = 0;
};

LanePlan lane_plan(const CollArgs& a) {
  const Levels l(a);
  const size_t c = a.count, hc = static_cast<size_t>(l.hosts) * c;
  const BlockRange piece = block_range(c, static_cast<size_t>(l.q), static_cast<size_t>(l.local));
  // Scratch is sized before tmp exists (a.tmp null): no pointers into it then.
  auto tmp_at = [&](size_t e) { return a.tmp == nullptr ? nullptr : a.tmp_at(e); };
  LanePlan lp;
  CollArgs& s = lp.args;
  s = a;
  s.hosts = nullptr;
  s.rank = l.host;
  s.world = l.hosts;
  // hier scales kAvg itself, once the lanes have summed.
  if (a.op == ReduceOp::kAvg) s.op = ReduceOp::kSum;
  size_t bytes = 0;
  switch (a.kind) {
    case K::kReduceScatter:  // lane group `local` of the host's sums, packed
      s.in = tmp_at(static_cast<size_t>(l.local) * hc);
      lp.tmp_before = static_cast<size_t>(a.world) * c;
      bytes = hc * a.es();
      break;
    case K::kAllgather:  // into tmp, by host
      s.out = a.tmp;
      lp.tmp_before = hc;
      bytes = hc * a.es();
      break;
    case K::kBroadcast:
      s.in = (a.rank == a.root ? a.in : a.out) + piece.begin * a.es();
      s.out = a.out_at(piece.begin);
      s.count = piece.size;
      s.root = l.g.host_of(a.root);
      bytes = piece.size * a.es();
      break;
    case K::kReduce: {  // piece `local` of the host's sums, in place
      s.out = a.rank == a.root ? a.out_at(piece.begin) : tmp_at(piece.begin);
      s.in = s.out;
      s.count = piece.size;
      s.root = l.g.host_of(a.root);
      lp.tmp_before = c;
      bytes = piece.size * a.es();
      break;
    }
    default:
      break;
  }
  s.tmp = tmp_at(lp.tmp_before);
  lp.algo = lane_algorithm(a, a.kind, bytes);
  return lp;
}

void run_lane(const LanePlan& lp, const Levels& l, Program& p) {
  if (lp.args.count == 0) return;
  build_in_group(lp.args, find_algorithm(lp.algo)->build[static_cast<size_t>(lp.args.kind)], l.lane,
                 p);
}

// Reduce-scatter within the host over lane groups: group g is the blocks of
// the ranks of lane g (host h's at rank_at(h, g) * count in `in`), gathered at
// acc[(g * hosts + h) * count]. A ring as ring_reduce_scatter_blocks runs it,
// one message per host and step; local rank l ends with group l.
void within_reduce_scatter_groups(const CollArgs& a, const Levels& l, std::byte* acc, Program& p) {
  const size_t c = a.count, es = a.es();
  const int q = l.q, r = l.local, next = mod(r + 1, q), prev = mod(r - 1, q);
  auto in_blk = [&](int g, int h) { return a.in_at(static_cast<size_t>(l.rank_at(h, g)) * c); };
  auto acc_blk = [&](int g, int h) {
    return acc + (static_cast<size_t>(g) * static_cast<size_t>(l.hosts) + static_cast<size_t>(h)) *
                     c * es;
  };
  Program::Group group(p, l.members);
  for (int s = 0; s < q - 1; ++s) {
    const int sg = mod(r - 1 - s, q), rg = mod(r - 2 - s, q);
    for (int h = 0; h < l.hosts; ++h) p.send(next, s == 0 ? in_blk(sg, h) : acc_blk(sg, h), c);
    for (int h = 0; h < l.hosts; ++h) p.recv_reduce(prev, acc_blk(rg, h), in_blk(rg, h), c);
    p.next_step();
  }
}

// Allgather within the host over lane groups: this rank's group is in
// `mine` by host; every group lands at its ranks' blocks of out.
void within_allgather_groups(const CollArgs& a, const Levels& l, const std::byte* mine,
                             Program& p) {
  const size_t c = a.count;
  const int q = l.q, r = l.local, next = mod(r + 1, q), prev = mod(r - 1, q);
  auto out_blk = [&](int g, int h) { return a.out_at(static_cast<size_t>(l.rank_at(h, g)) * c); };
  auto mine_blk = [&](int h) { return mine + static_cast<size_t>(h) * c * a.es(); };
  for (int h = 0; h < l.hosts; ++h) p.copy(out_blk(r, h), mine_blk(h), c);
  Program::Group group(p, l.members);
  for (int s = 0; s < q - 1; ++s) {
    const int sg = mod(r - s, q), rg = mod(r - s - 1, q);
    for (int h = 0; h < l.hosts; ++h) p.send(next, s == 0 ? mine_blk(h) : out_blk(sg, h), c);
    for (int h = 0; h < l.hosts; ++h) p.recv(prev, out_blk(rg, h), c);
    p.next_step();
  }
}

}  // namespace

void hier_reduce_scatter(const CollArgs& a, Program& p) {
  if (!two_levels(a)) return ring_reduce_scatter(a, p);
  const Levels l(a);
  within_reduce_scatter_groups(a, l, a.tmp, p);
  run_lane(lane_plan(a), l, p);
  if (a.op == ReduceOp::kAvg) p.scale(a.out, a.count);
}

void hier_allgather(const CollArgs& a, Program& p) {
  if (!two_levels(a)) return ring_allgather(a, p);
  const Levels l(a);
  run_lane(lane_plan(a), l, p);
  within_allgather_groups(a, l, a.tmp, p);
}

void hier_broadcast(const CollArgs& a, Program& p) {
  if (!two_levels(a)) return ring_broadcast(a, p);
  const Levels l(a);
  const size_t q = static_cast<size_t>(l.q);
  // Scatter over the root's host: piece l to local rank l.
  if (l.host == l.g.host_of(a.root)) {
    const int root_local = l.g.local_rank(a.root);
    Program::Group group(p, l.members);
    if (a.rank == a.root) {
      p.copy(a.out, a.in, a.count);
      for (int j = 0; j < l.q; ++j) {
        const BlockRange b = block_range(a.count, q, static_cast<size_t>(j));
        if (j != root_local && b.size > 0) p.send(j, a.in_at(b.begin), b.size);
      }
    } else {
      const BlockRange b = block_range(a.count, q, static_cast<size_t>(l.local));
      if (b.size > 0) p.recv(root_local, a.out_at(b.begin), b.size);
    }
    p.next_step();
  }
  run_lane(lane_plan(a), l, p);
  build_in_group(within_args(a, l), ring_allgather_blocks, l.members, p);
}

void hier_reduce(const CollArgs& a, Program& p) {
  if (!two_levels(a)) return ring_reduce(a, p);
  const Levels l(a);
  const size_t q = static_cast<size_t>(l.q);
  // The root sums into its output, the others into tmp (they have none).
  std::byte* acc = a.rank == a.root ? a.out : a.tmp;
  CollArgs within = within_args(a, l);
  within.out = acc;
  build_in_group(within, ring_reduce_scatter_blocks, l.members, p);
  run_lane(lane_plan(a), l, p);
  if (l.host != l.g.host_of(a.root)) return;
  // Gather the pieces, now reduced over every host, at the root.
  const int root_local = l.g.local_rank(a.root);
  {
    Program::Group group(p, l.members);
    for (int j = 0; j < l.q; ++j) {
      const BlockRange b = block_range(a.count, q, static_cast<size_t>(j));
      if (j == root_local || b.size == 0) continue;
      if (a.rank == a.root) {
        p.recv(j, a.out_at(b.begin), b.size);
      } else if (j == l.local) {
        p.send(root_local, acc + b.begin * a.es(), b.size);
      }
    }
  }
  if (a.rank == a.root && a.op == ReduceOp::kAvg) p.scale(a.out, a.count);
}

// The three phases pass one token along: each phase's first send reads the
// token its predecessor received last (dissemination sends tmp[k] and receives
// into tmp[k + 1] in round k), so the Program orders the phases by their
// buffers. Ranks off lane 0 go straight from the first phase to the third.
void hier_barrier(const CollArgs& a, Program& p) {
  if (!two_levels(a)) return dissemination_barrier(a, p);
  const Levels l(a);
  const size_t in_host = static_cast<size_t>(ceil_log2(l.q));
  const size_t between = static_cast<size_t>(ceil_log2(l.hosts));
  CollArgs within = within_args(a, l);
  build_in_group(within, dissemination_barrier, l.members, p);
  if (l.local == 0) {
    CollArgs lane = a;
    lane.rank = l.host;
    lane.world = l.hosts;
    lane.tmp = a.tmp + in_host;
    build_in_group(lane, dissemination_barrier, l.lane, p);
  }
  within.tmp = a.tmp + in_host + (l.local == 0 ? between : 0);
  build_in_group(within, dissemination_barrier, l.members, p);
}

size_t hier_ops_scratch(const CollArgs& a) {
  if (!two_levels(a)) {
    return a.kind == K::kBarrier ? dissemination_scratch(a) : ring_scratch(a);
  }
  if (a.kind == K::kBarrier) {
    return 2 * static_cast<size_t>(ceil_log2(a.hosts->per_host())) +
           static_cast<size_t>(ceil_log2(a.hosts->hosts())) + 2;
  }
  const LanePlan lp = lane_plan(a);
  return lp.tmp_before + temp_elems(lp.args, lp.algo);
}

}  // namespace rdmaflow
