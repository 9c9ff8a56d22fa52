// Pairwise alltoall: at step s, send to rank+s and receive from rank-s, so
// every rank has one partner in each direction per step.
#include <limits>

#include "collectives/algorithms/registry.h"

namespace rdmaflow {

void pairwise_alltoall(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  const size_t c = a.count;
  // In place: the input is overwritten as blocks arrive, so send from a copy.
  const std::byte* in = a.in;
  if (a.in == a.out && n > 1) {
    p.copy(a.tmp, a.in, c * n);
    in = a.tmp;
  }
  p.copy(a.out_at(r * c), in + r * c * a.es(), c);
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    p.send(to, in + to * c * a.es(), c);
    p.recv(from, a.out_at(from * c), c);
    p.next_step();
  }
}

size_t pairwise_scratch(const CollArgs& a) {
  return a.in == a.out ? static_cast<size_t>(a.world) * a.count : 0;
}

double pairwise_rounds(CollectiveKind, const CostTerms& t) {
  return t.n - 1;
}

double pairwise_cost(CollectiveKind kind, const CostTerms& t) {
  const double n = t.n, m = t.m, a = t.a, b = t.b;
  if (kind != CollectiveKind::kAlltoall) return std::numeric_limits<double>::infinity();
  return (n - 1) * a + (n - 1) / n * m * b;
}

}  // namespace rdmaflow
