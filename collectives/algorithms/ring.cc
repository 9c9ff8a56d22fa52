// Ring algorithms (Patarasuk & Yuan): a reduce-scatter in which each block
// travels once around the ring collecting every rank's contribution, then an
// allgather that carries the finished blocks around once more. Per rank:
// 2(n-1) messages of count/n elements, the bandwidth-optimal schedule.
// Blocks are split into pieces by the Program, and the executor forwards a
// piece as soon as it is reduced, so transfer and reduction overlap.
#include <algorithm>
#include <limits>

#include "collectives/algorithms/parts.h"
#include "collectives/algorithms/registry.h"

namespace rdmaflow {
namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace

void ring_reduce_scatter_blocks(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  if (n == 1) return p.copy(a.out, a.in, a.count);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto blk = [&](int b) { return block_range(a.count, n, mod(b, n)); };
  // At step s, block r-1-s leaves and block r-2-s comes in and is reduced;
  // after n-1 steps this rank holds block r fully reduced.
  for (int s = 0; s < n - 1; ++s) {
    BlockRange sb = blk(r - 1 - s), rb = blk(r - 2 - s);
    p.send(next, s == 0 ? a.in_at(sb.begin) : a.out_at(sb.begin), sb.size);
    p.recv_reduce(prev, a.out_at(rb.begin), a.in_at(rb.begin), rb.size);
    p.next_step();
  }
}

void ring_allgather_blocks(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  if (n == 1) return;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto blk = [&](int b) { return block_range(a.count, n, mod(b, n)); };
  for (int s = 0; s < n - 1; ++s) {
    BlockRange sb = blk(r - s), rb = blk(r - s - 1);
    p.send(next, a.out_at(sb.begin), sb.size);
    p.recv(prev, a.out_at(rb.begin), rb.size);
    p.next_step();
  }
}

void ring_allreduce(const CollArgs& a, Program& p) {
  ring_reduce_scatter_blocks(a, p);
  if (a.world > 1 && a.op == ReduceOp::kAvg) {
    const BlockRange mine = block_range(a.count, a.world, a.rank);
    p.scale(a.out_at(mine.begin), mine.size);
  }
  ring_allgather_blocks(a, p);
}

void ring_reduce_scatter(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  if (n == 1) return p.copy(a.out, a.in, c);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  // Partial sums live in tmp (the input is read-only); the last one lands in out.
  for (int s = 0; s < n - 1; ++s) {
    const size_t sb = mod(r - 1 - s, n) * c, rb = mod(r - 2 - s, n) * c;
    p.send(next, s == 0 ? a.in_at(sb) : a.tmp_at(sb), c);
    std::byte* dst = (s == n - 2) ? a.out : a.tmp_at(rb);
    p.recv_reduce(prev, dst, a.in_at(rb), c);
    p.next_step();
  }
  if (a.op == ReduceOp::kAvg) p.scale(a.out, c);
}

void ring_allgather(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  p.copy(a.out_at(r * c), a.in, c);
  if (n == 1) return;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    p.send(next, a.out_at(mod(r - s, n) * c), c);
    p.recv(prev, a.out_at(mod(r - s - 1, n) * c), c);
    p.next_step();
  }
}

void ring_broadcast(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const int vr = mod(r - a.root, n);
  if (vr == 0) {
    p.copy(a.out, a.in, a.count);
    if (n > 1) p.send(mod(r + 1, n), a.in, a.count);
    return;
  }
  p.recv(mod(r - 1, n), a.out, a.count);
  if (vr < n - 1) p.send(mod(r + 1, n), a.out, a.count);
}

void ring_reduce(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  if (n == 1) return p.copy(a.out, a.in, a.count);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto blk = [&](int b) { return block_range(a.count, n, mod(b, n)); };
  // The root accumulates in its output; the others in tmp.
  std::byte* acc = (r == a.root) ? a.out : a.tmp;
  auto acc_at = [&](size_t e) { return acc + e * a.es(); };
  for (int s = 0; s < n - 1; ++s) {
    BlockRange sb = blk(r - 1 - s), rb = blk(r - 2 - s);
    p.send(next, s == 0 ? a.in_at(sb.begin) : acc_at(sb.begin), sb.size);
    p.recv_reduce(prev, acc_at(rb.begin), a.in_at(rb.begin), rb.size);
    p.next_step();
  }
  BlockRange mine = blk(r);
  if (a.op == ReduceOp::kAvg) p.scale(acc_at(mine.begin), mine.size);
  // Gather the finished blocks at the root.
  if (r != a.root) {
    p.send(a.root, acc_at(mine.begin), mine.size);
  } else {
    for (int b = 0; b < n; ++b) {
      if (b != r) p.recv(b, a.out_at(blk(b).begin), blk(b).size);
    }
  }
}

size_t ring_scratch(const CollArgs& a) {
  if (a.kind == CollectiveKind::kReduceScatter) return static_cast<size_t>(a.world) * a.count;
  return a.kind == CollectiveKind::kReduce ? a.count : 0;
}

double ring_rounds(CollectiveKind kind, const CostTerms& t) {
  if (kind == CollectiveKind::kAllreduce) return 2 * (t.n - 1);
  return kind == CollectiveKind::kReduce ? t.n : t.n - 1;
}

// Allreduce: 2(n - 1) steps in which every rank sends a block of m/n to the
// next; numbered host by host, n/q of the n edges leave a host. The chain is
// every step: a block goes on once the one before it arrived.
Work ring_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  const double steps = 2 * (t.n - 1), across = t.q > 1 ? t.n / t.q : t.n;
  w.add(true, steps * across * t.pieces(t.m / t.n), steps * across * t.m / t.n);
  w.add(false, steps * (t.n - across) * t.pieces(t.m / t.n), steps * (t.n - across) * t.m / t.n);
  w.reduced = (t.n - 1) * t.m;  // the reduce-scatter's n - 1 blocks on every rank
  w.copied = (t.n - 1) * t.m;   // the allgather's, out of the slots
  const double block = std::min(t.m / t.n, t.k);
  w.chain = steps * across / t.n * block;
  w.host_chain = steps * (t.n - across) / t.n * block;
  return w;
}

double ring_cost(CollectiveKind kind, const CostTerms& t) {
  const double n = t.n, m = t.m, a = t.a, b = t.b, g = t.g, k = t.k;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return 2 * (n - 1) * a * t.pieces(m / n) + 2 * (n - 1) / n * m * b + (n - 1) / n * m * g;
    case CollectiveKind::kReduceScatter:  // m = input bytes (world blocks)
      return (n - 1) * a * t.pieces(m / n) + (n - 1) / n * m * (b + g);
    case CollectiveKind::kAllgather:  // m = output bytes
      return (n - 1) * a * t.pieces(m / n) + (n - 1) / n * m * b;
    case CollectiveKind::kBroadcast:
      return (n - 1) * (a + std::min(m, k) * b) + m * b + t.pieces(m) * a;
    case CollectiveKind::kReduce:
      return n * a * t.pieces(m / n) + (n - 1) / n * m * (2 * b + g);
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace rdmaflow
