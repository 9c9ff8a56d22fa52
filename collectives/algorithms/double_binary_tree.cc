// Double binary tree allreduce (Sanders, Speck & Träff; NCCL's "tree"): two
// binary trees in which every rank is a leaf in one and internal in the other
// each carry half of the buffer. Each half is reduced up its tree and
// broadcast back down, piece by piece, so both trees and both directions are
// busy at once: full bandwidth of a pipelined tree at log2(n) latency.
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/algorithms/registry.h"
#include "collectives/topology.h"

namespace rdmaflow {

void dbtree_allreduce(const CollArgs& a, Program& p) {
  if (a.world == 1) return p.copy(a.out, a.in, a.count);
  DoubleTree dt = double_binary_tree(a.world, a.rank);
  const TreeNode* trees[2] = {&dt.first, &dt.second};
  const size_t half = (a.count + 1) / 2;
  const BlockRange halves[2] = {{0, half}, {half, a.count - half}};
  const size_t piece = p.piece_elems();
  const size_t chunks = (half + piece - 1) / piece;

  // Interleave the two trees piece by piece so that neither waits on the other.
  for (size_t c = 0; c < chunks; ++c) {
    for (int t = 0; t < 2; ++t) {
      const TreeNode& node = *trees[t];
      const size_t begin = c * piece;
      if (begin >= halves[t].size) continue;
      const size_t off = halves[t].begin + begin;
      const size_t n = std::min(piece, halves[t].size - begin);
      std::byte* acc = a.out_at(off);
      const std::byte* cur = a.in_at(off);
      for (int child : node.children) {
        p.recv_reduce(child, acc, cur, n);
        cur = acc;
      }
      if (node.parent < 0) {
        p.copy(acc, cur, n);
        if (a.op == ReduceOp::kAvg) p.scale(acc, n);
      } else {
        p.send(node.parent, cur, n);
        p.recv(node.parent, acc, n);
      }
      for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
        p.send(*it, acc, n);
      }
    }
    p.next_step();
  }
}

double dbtree_rounds(CollectiveKind kind, const CostTerms& t) {
  return kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kBarrier ? 2 * t.lg : t.lg;
}

// Allreduce: two trees of n - 1 edges, each carrying half the buffer up and
// down, counted on the trees themselves: their edges leave a host more often
// than a binomial tree's (on 2 hosts x 2 ranks, 4 of the 6 edges against 1 of
// 3). The chain: a piece of a half up the deeper tree's longest path and back
// down, half the binomial tree's bytes below two pieces.
Work dbtree_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  const int n = static_cast<int>(t.n), q = std::max(1, static_cast<int>(t.q));
  const bool one_level = t.q <= 1;
  auto leaves = [&](int a, int b) { return one_level || a / q != b / q; };
  std::vector<int> parent[2] = {std::vector<int>(n), std::vector<int>(n)};
  std::vector<bool> leaf[2] = {std::vector<bool>(n), std::vector<bool>(n)};
  for (int r = 0; r < n; ++r) {
    const DoubleTree dt = double_binary_tree(n, r);
    const TreeNode* me[2] = {&dt.first, &dt.second};
    for (int tree = 0; tree < 2; ++tree) {
      for (int child : me[tree]->children) w.add(leaves(child, r), 2 * t.pieces(t.m / 2), t.m);
      parent[tree][r] = me[tree]->parent;
      leaf[tree][r] = me[tree]->children.empty();
    }
  }
  double link = 0, host = 0;  // the longest path's edges (the link's first)
  for (int tree = 0; tree < 2; ++tree) {
    for (int r = 0; r < n; ++r) {
      if (!leaf[tree][r]) continue;  // paths from the leaves up
      double l = 0, h = 0;
      for (int at = r; parent[tree][at] >= 0; at = parent[tree][at]) {
        (leaves(at, parent[tree][at]) ? l : h) += 1;
      }
      if (l > link || (l == link && h > host)) link = l, host = h;
    }
  }
  const double hop = 2 * std::min(t.m / 2, t.k);  // a piece up and back down
  w.chain = link * hop;
  w.host_chain = host * hop;
  w.reduced = (t.n - 1) * t.m;  // two trees of n - 1 edges, half the buffer each
  w.copied = (t.n - 1) * t.m;   // each half's result, on every rank but its tree's root
  return w;
}

double dbtree_cost(CollectiveKind kind, const CostTerms& t) {
  const double m = t.m, a = t.a, b = t.b, g = t.g, lg = t.lg, k = t.k;
  if (kind != CollectiveKind::kAllreduce) return std::numeric_limits<double>::infinity();
  // Each tree carries half the buffer up and down at once, both directions of
  // a link in parallel: a rank internal to one tree and a leaf of the other
  // receives (and sends) 2m in all; with two ranks each tree is one edge and
  // a rank receives m.
  const double per_direction = t.n <= 2 ? m : 2 * m;
  return 2 * lg * (a + std::min(m / 2, k) * b) + per_direction * b + m * g + t.pieces(m / 2) * a;
}

}  // namespace rdmaflow
