// Dissemination barrier (Hensgen, Finkel & Manber): in round k every rank
// signals rank+2^k and waits for rank-2^k. After ceil(log2 n) rounds every rank
// has transitively heard from all others. The one-byte token a round sends is
// the one the previous round received, and a round's token is received into
// a reduction with the previous one: the Program orders items by the buffers
// they touch, so without that read the token of round k + 1 would not wait
// for round k's and a rank could hear "everyone" before its round-k partner
// (and those behind it) arrived (seen with 6 ranks, three rounds).
#include <limits>

#include "collectives/algorithms/registry.h"
#include "collectives/topology.h"

namespace rdmaflow {

void dissemination_barrier(const CollArgs& a, Program& p) {
  const int n = a.world, r = a.rank;
  int k = 0;
  for (int d = 1; d < n; d *= 2, ++k) {
    p.send((r + d) % n, a.tmp + k, 1);
    p.recv_reduce((r - d + n) % n, a.tmp + k + 1, a.tmp + k, 1);
    p.next_step();
  }
}

size_t dissemination_scratch(const CollArgs& a) {
  return static_cast<size_t>(ceil_log2(a.world)) + 2;  // one-byte tokens
}

double dissemination_rounds(CollectiveKind, const CostTerms& t) {
  return t.lg;
}

double dissemination_cost(CollectiveKind kind, const CostTerms& t) {
  if (kind != CollectiveKind::kBarrier) return std::numeric_limits<double>::infinity();
  return t.lg * t.a;
}

}  // namespace rdmaflow
