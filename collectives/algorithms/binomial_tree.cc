// Binomial tree algorithms: ceil(log2 n) rounds, each rank talks to at most one
// parent and log2 n children. The Program splits the buffer into pieces, so a
// piece moves up (reduce) or down (broadcast) the tree while the next one is in
// flight behind it: a pipelined tree.
#include <algorithm>
#include <limits>

#include "collectives/algorithms/registry.h"
#include "collectives/topology.h"

namespace rdmaflow {
namespace {

// Reduce the whole buffer up the tree into `acc` at `root` (acc may be tmp at
// the other ranks). Leaves send their input straight from `in`.
void reduce_up(const CollArgs& a, Program& p, const TreeNode& node, std::byte* acc, bool is_root) {
  const std::byte* cur = a.in;
  for (int child : node.children) {
    p.recv_reduce(child, acc, cur, a.count);
    cur = acc;
  }
  if (is_root) {
    p.copy(acc, cur, a.count);  // no children: the result is the input
    if (a.op == ReduceOp::kAvg) p.scale(acc, a.count);
  } else {
    p.send(node.parent, cur, a.count);
  }
  p.next_step();
}

// Broadcast `buf` down the tree; the largest subtree is served first.
void broadcast_down(const CollArgs& a, Program& p, const TreeNode& node, std::byte* buf,
                    const std::byte* root_src, bool is_root) {
  if (!is_root) p.recv(node.parent, buf, a.count);
  const std::byte* src = is_root ? root_src : buf;
  for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
    p.send(*it, src, a.count);
  }
  p.next_step();
}

}  // namespace

void tree_reduce(const CollArgs& a, Program& p) {
  TreeNode node = binomial_tree(a.world, a.rank, a.root);
  const bool is_root = a.rank == a.root;
  reduce_up(a, p, node, is_root ? a.out : a.tmp, is_root);
}

void tree_broadcast(const CollArgs& a, Program& p) {
  TreeNode node = binomial_tree(a.world, a.rank, a.root);
  const bool is_root = a.rank == a.root;
  if (is_root) p.copy(a.out, a.in, a.count);
  broadcast_down(a, p, node, a.out, a.in, is_root);
}

void tree_allreduce(const CollArgs& a, Program& p) {
  TreeNode node = binomial_tree(a.world, a.rank, 0);
  const bool is_root = a.rank == 0;
  reduce_up(a, p, node, a.out, is_root);
  broadcast_down(a, p, node, a.out, a.out, is_root);
}

void tree_barrier(const CollArgs& a, Program& p) {
  // A one-byte allreduce: nobody leaves before the root heard from everyone.
  CollArgs b = a;
  b.type = DataType::kU8;
  b.op = ReduceOp::kMax;
  b.count = 1;
  b.in = a.tmp;
  b.out = a.tmp + 1;
  tree_allreduce(b, p);
}

size_t tree_scratch(const CollArgs& a) {
  if (a.kind == CollectiveKind::kBarrier) {
    return static_cast<size_t>(ceil_log2(a.world)) + 2;  // one-byte tokens
  }
  return a.kind == CollectiveKind::kReduce ? a.count : 0;
}

double tree_rounds(CollectiveKind kind, const CostTerms& t) {
  return kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kBarrier ? 2 * t.lg : t.lg;
}

// Allreduce: the ranks 2^k away from their parent send the buffer up (in
// pieces) and receive it back down: n - 1 edges, each carrying it both ways.
// The chain: a piece up through every level and back down.
Work tree_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  for (double d = 1; d < t.n; d *= 2) {
    const double children = std::ceil((t.n - d) / (2 * d));  // ranks r with r mod 2d == d
    w.add(t.leaves_host(d), 2 * children * t.pieces(t.m), 2 * children * t.m);
    w.step(t.leaves_host(d), 2 * t.m, 2 * t.k);
    w.add_top(t.leaves_host(d), t.m);  // the root's send down to its child
  }
  w.reduced = (t.n - 1) * t.m;  // each child's buffer, on the way up
  w.copied = (t.n - 1) * t.m;   // the result, out of a slot on every rank but the root
  w.top_memory = t.lg * t.m;    // the root reduces a buffer from each child
  return w;
}

double tree_cost(CollectiveKind kind, const CostTerms& t) {
  const double m = t.m, a = t.a, b = t.b, g = t.g, lg = t.lg, k = t.k;
  switch (kind) {
    case CollectiveKind::kAllreduce: {
      // Pieces go down the tree while later ones still come up, and a link
      // carries both directions at once: the busiest rank (the root) receives
      // lg n buffers and sends lg n, in parallel (2 hosts, 16 MiB: 1.2x one
      // link time of the buffer, not 2x; docs/scaling.md). Each level at the
      // costs of its own edges (rooted at rank 0, the ranks 2^l apart): on two
      // levels the lowest log2(q) stay within the host, at the host's costs
      // (CostTerms::beta_at), as tree_work counts them.
      double fill = 0, bulk = 0;  // a piece up (or down) through every level; the buffer
      for (double d = 1; d < t.n; d *= 2) {
        fill += t.alpha_at(d) + std::min(m, k) * t.beta_at(d);
        bulk += m * t.beta_at(d);
      }
      return 2 * fill + bulk + lg * m * g;
    }
    // Broadcast and reduce are rooted anywhere: the levels of a root that is
    // not a host's first rank pair ranks of two hosts, so every level is
    // costed at the link's costs.
    case CollectiveKind::kBroadcast:
      return lg * (a + std::min(m, k) * b) + lg * m * b;
    case CollectiveKind::kReduce:
      return lg * (a + std::min(m, k) * b) + lg * m * (b + g);
    case CollectiveKind::kBarrier: {  // a one-byte allreduce rooted at rank 0
      double hops = 0;
      for (double d = 1; d < t.n; d *= 2) hops += t.alpha_at(d);
      return 2 * hops;
    }
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace rdmaflow
