// Direct exchanges, one round: every rank writes its whole input to every
// other rank at once and waits for theirs. n - 1 messages per rank instead of
// log2(n) rounds, so only for small buffers and small worlds; the case for it is
// an oversubscribed host, where each dependent round costs a reschedule of the
// partner (docs/benchmarks.md, "Collectives").
//
//   allgather: the blocks land in place in out.
//   allreduce: the contributions are combined in rank order,
//              ((x0 op x1) op x2) ..., so every rank computes the same bits.
#include <limits>

#include "collectives/algorithms/registry.h"

namespace rdmaflow {

void direct_allgather(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  p.copy(a.out_at(r * c), a.in, c);
  for (int s = 1; s < n; ++s) p.send((r + s) % n, a.in, c);
  for (int s = 1; s < n; ++s) {
    const int from = (r - s + n) % n;
    p.recv(from, a.out_at(from * c), c);
  }
}

void direct_allreduce(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  if (n == 1) return p.copy(a.out, a.in, c);
  // In place, out is the accumulator, so the own contribution is kept in tmp.
  const std::byte* own = a.in;
  if (a.in == a.out) {
    p.copy(a.tmp, a.in, c);
    own = a.tmp;
  }
  for (int s = 1; s < n; ++s) p.send((r + s) % n, own, c);
  if (r == 0) {
    p.copy(a.out, own, c);
  } else {
    p.recv(0, a.out, c);
  }
  for (int j = 1; j < n; ++j) {
    if (j == r) {
      p.reduce(a.out, own, c);
    } else {
      p.recv_reduce(j, a.out, a.out, c);
    }
  }
  if (a.op == ReduceOp::kAvg) p.scale(a.out, c);
}

size_t direct_scratch(const CollArgs& a) {
  return a.kind == CollectiveKind::kAllreduce && a.in == a.out ? a.count : 0;
}

double direct_rounds(CollectiveKind, const CostTerms&) {
  return 1;
}

// Allreduce: every rank sends the buffer to every other rank. The chain: one
// round, in which a rank's link brings in every other rank's first piece.
Work direct_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  const double others = t.n - t.q, near = t.q - 1;
  w.add(true, t.n * others * t.pieces(t.m), t.n * others * t.m);
  w.add(false, t.n * near * t.pieces(t.m), t.n * near * t.m);
  w.reduced = t.n * (t.n - 1) * t.m;  // every rank reduces every other's buffer
  w.copied = t.n * t.m;               // rank 0's buffer into every output (rank 0's own: a copy)
  w.step(true, others * t.m, others * t.k);
  w.step(false, near * t.m, near * t.k);
  return w;
}

double direct_cost(CollectiveKind kind, const CostTerms& t) {
  const double n = t.n, m = t.m, a = t.a, b = t.b, g = t.g;
  switch (kind) {
    case CollectiveKind::kAllreduce:  // one round of n - 1 concurrent messages
      return a + (n - 1) * (t.pieces(m) * 0.5 * a + m * (b + g));
    case CollectiveKind::kAllgather:
      return a + (n - 1) * (0.5 * a) + (n - 1) / n * m * b;
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace rdmaflow
