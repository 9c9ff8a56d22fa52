// Who talks to whom: the rank topologies the algorithms are built on.
#pragma once

#include <vector>

namespace rdmaflow {

// Binomial tree rooted at `root`. Children are listed smallest subtree first
// (the order a reduction receives them in); a broadcast sends in reverse.
struct TreeNode {
  int parent = -1;
  std::vector<int> children;
};
TreeNode binomial_tree(int world, int rank, int root);

// NCCL-style binary tree rooted at rank 0 (rank 0 has one child): internal
// nodes are the even ranks, leaves the odd ones, depth ~log2(world).
TreeNode binary_tree(int world, int rank);

// The two trees of a double binary tree: the first is binary_tree(); the second
// is its mirror (even world) or its shift by one (odd world), so that a rank
// that is a leaf in one tree is internal in the other.
struct DoubleTree {
  TreeNode first;
  TreeNode second;
};
DoubleTree double_binary_tree(int world, int rank);

// The Thakur-Rabenseifner-Gropp fold for a world that is not a power of two.
// With p = the largest power of two <= world and r = world - p, the first 2r
// ranks pair up (2i, 2i+1): the even one hands its data to the odd one and sits
// out the power-of-two phase; every other rank gets a virtual rank in [0, p).
struct Fold {
  int pof2 = 1;      // p
  int rem = 0;       // r
  int vrank = -1;    // virtual rank in [0, p), or -1 when folded away
  int partner = -1;  // the pair partner (2i <-> 2i+1) for ranks < 2r, else -1
  bool folded_away() const { return vrank < 0; }
};
Fold make_fold(int world, int rank);
// Real rank of virtual rank v.
int fold_real_rank(const Fold& f, int v);
// Real ranks [first, last] a virtual rank stands for (2v, 2v+1 when v < r).
// Consecutive virtual ranks stand for consecutive real ranks.
int fold_first_real(const Fold& f, int v);
int fold_last_real(const Fold& f, int v);

inline bool is_pow2(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}
int floor_pow2(int n);
int ceil_log2(int n);

}  // namespace rdmaflow
