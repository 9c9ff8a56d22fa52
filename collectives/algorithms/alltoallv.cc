// Pairwise alltoallv (parts.h): pairwise.cc's schedule with a block per peer
// of its own size and place.
#include "collectives/algorithms/parts.h"

namespace rdmaflow {

void pairwise_alltoallv(const CollArgs& a, const AlltoallvBlocks& b, Program& p) {
  const int n = a.world, r = a.rank;
  p.copy(a.out_at(b.recv_displs[r]), a.in_at(b.send_displs[r]), b.send_counts[r]);
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    p.send(to, a.in_at(b.send_displs[to]), b.send_counts[to]);
    p.recv(from, a.out_at(b.recv_displs[from]), b.recv_counts[from]);
    p.next_step();
  }
}

}  // namespace rdmaflow
