// Recursive doubling: log2(p) steps, each exchanging the whole (allreduce) or
// the accumulated (allgather) data with the rank 2^k away. The fewest
// messages, so the choice for tiny buffers where latency is everything. A
// world that is not a power of two is folded as in rabenseifner.cc (the even
// rank of each of the first r pairs hands everything to its odd partner).
#include <limits>

#include "collectives/algorithms/registry.h"
#include "collectives/topology.h"

namespace rdmaflow {

void rd_allreduce(const CollArgs& a, Program& p) {
  if (a.world == 1) return p.copy(a.out, a.in, a.count);
  const Fold f = make_fold(a.world, a.rank);
  if (f.folded_away()) {
    p.send(f.partner, a.in, a.count);
    p.next_step();
    p.recv(f.partner, a.out, a.count);
    return;
  }
  const std::byte* cur = a.in;
  if (f.partner >= 0) {
    p.recv_reduce(f.partner, a.out, a.in, a.count);
    cur = a.out;
    p.next_step();
  }
  // Alternate between tmp and out so that a step never overwrites what the
  // previous one is still sending; the last step lands in out.
  int steps = 0;
  for (int d = 1; d < f.pof2; d *= 2) ++steps;
  int k = 0;
  for (int d = 1; d < f.pof2; d *= 2, ++k) {
    const int peer = fold_real_rank(f, f.vrank ^ d);
    std::byte* dst = ((steps - 1 - k) % 2 == 0) ? a.out : a.tmp;
    p.send(peer, cur, a.count);
    p.recv_reduce(peer, dst, cur, a.count);
    cur = dst;
    p.next_step();
  }
  if (a.op == ReduceOp::kAvg) p.scale(a.out, a.count);
  if (f.partner >= 0) p.send(f.partner, a.out, a.count);
}

void rd_allgather(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  p.copy(a.out_at(r * c), a.in, c);
  if (n == 1) return;
  const Fold f = make_fold(n, r);
  if (f.folded_away()) {
    p.send(f.partner, a.out_at(r * c), c);
    p.next_step();
    p.recv(f.partner, a.out, r * c);
    p.recv(f.partner, a.out_at((r + 1) * c), (n - r - 1) * c);
    return;
  }
  if (f.partner >= 0) {
    p.recv(f.partner, a.out_at(f.partner * c), c);
    p.next_step();
  }
  // Virtual windows map to contiguous ranges of real blocks.
  for (int d = 1; d < f.pof2; d *= 2) {
    const int pv = f.vrank ^ d;
    const int lo = f.vrank & ~(d - 1), plo = pv & ~(d - 1);
    const size_t mine = fold_first_real(f, lo) * c;
    const size_t mine_n = (fold_last_real(f, lo + d - 1) + 1) * c - mine;
    const size_t theirs = fold_first_real(f, plo) * c;
    const size_t theirs_n = (fold_last_real(f, plo + d - 1) + 1) * c - theirs;
    const int peer = fold_real_rank(f, pv);
    p.send(peer, a.out_at(mine), mine_n);
    p.recv(peer, a.out_at(theirs), theirs_n);
    p.next_step();
  }
  if (f.partner >= 0) {
    p.send(f.partner, a.out, f.partner * c);
    p.send(f.partner, a.out_at((f.partner + 1) * c), (n - f.partner - 1) * c);
  }
}

void rd_reduce_scatter(const CollArgs& a, Program& p) {
  // Tiny buffers only: allreduce everything, keep this rank's block.
  CollArgs b = a;
  b.count = a.count * a.world;
  b.out = a.tmp;
  b.tmp = a.tmp + b.count * a.es();
  rd_allreduce(b, p);
  p.copy(a.out, a.tmp_at(a.rank * a.count), a.count);
}

size_t rd_scratch(const CollArgs& a) {
  if (a.kind == CollectiveKind::kReduceScatter) return 2 * static_cast<size_t>(a.world) * a.count;
  return a.kind == CollectiveKind::kAllreduce ? a.count : 0;
}

double rd_rounds(CollectiveKind, const CostTerms& t) {
  const double fold = t.folded ? 2 : 0;
  return t.lgp + fold;
}

// Allreduce: in round k each of the p ranks sends the buffer to the rank 2^k
// away; the n - p ranks beyond fold in and out with a neighbour. The chain:
// every round.
Work rd_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  const double pieces = t.pieces(t.m);
  for (double d = 1; d < t.p; d *= 2) {
    w.add(t.leaves_host(d), t.p * pieces, t.p * t.m);
    w.step(t.leaves_host(d), t.m, t.k);
  }
  if (t.folded) {
    w.add(t.leaves_host(1), 2 * (t.n - t.p) * pieces, 2 * (t.n - t.p) * t.m);
    w.step(t.leaves_host(1), 2 * t.m, 2 * t.k);
  }
  w.reduced = (t.p * t.lgp + t.n - t.p) * t.m;  // what every round receives; a fold's once
  w.copied = (t.n - t.p) * t.m;                 // a folded rank's result (every round reduces)
  return w;
}

double rd_cost(CollectiveKind kind, const CostTerms& t) {
  const double m = t.m, a = t.a, b = t.b, g = t.g, p = t.p, lgp = t.lgp;
  const bool folded = t.folded;
  switch (kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter: {  // m = input bytes (world blocks)
      // Each round at the costs of its own edges (CostTerms::exchange_beta):
      // on two levels the rounds between ranks of a host (and a fold's pairs)
      // wait on the host, those between hosts on a link every rank of the
      // host sends over at once. On one level: lgp (a + m b + m g).
      double rounds = 0;
      for (double d = 1; d < p; d *= 2) rounds += t.alpha_at(d) + m * t.exchange_beta(d) + m * g;
      return rounds + (folded ? 2 * t.alpha_at(1) + 2 * m * t.exchange_beta(1) + m * g : 0);
    }
    case CollectiveKind::kAllgather:  // m = output bytes
      return lgp * a + (p - 1) / p * m * b + (folded ? 2 * a + m * b : 0);
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace rdmaflow
