// Who talks to whom: the rank topologies the algorithms are built on.
#pragma once

#include <cstdint>
#include <span>
#include <string>
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

// Which ranks share a host (can share memory), from one 64-bit key per rank:
// ranks with equal keys are one host. Hosts are numbered in the order of
// their lowest rank, and a host's ranks are numbered (local rank) in rank
// order, so every rank derives the same groups from the same keys.
class HostGroups {
 public:
  HostGroups() = default;
  // keys[r] is rank r's host key.
  explicit HostGroups(std::span<const uint64_t> keys);
  // All `world` ranks on one host.
  static HostGroups single_host(int world);
  // `hosts` hosts of `per_host` ranks each, numbered host by host.
  static HostGroups uniform(int hosts, int per_host);

  int world() const { return static_cast<int>(host_of_.size()); }
  int hosts() const { return static_cast<int>(members_.size()); }
  int host_of(int rank) const { return host_of_[rank]; }
  int local_rank(int rank) const { return local_rank_[rank]; }
  int local_size(int host) const { return static_cast<int>(members_[host].size()); }
  // The ranks of `host`, in rank order (local rank i is ranks(host)[i]).
  std::span<const int> ranks(int host) const { return members_[host]; }
  // Ranks per host when every host has as many, else 0.
  int per_host() const { return per_host_; }
  // Several hosts with several ranks each, as many on every host: the layout
  // a hierarchical collective needs.
  bool hierarchical() const { return hosts() > 1 && per_host_ > 1; }
  // The rank of local rank `local` on every host, in host order (a uniform
  // layout's lane `local` between hosts).
  std::vector<int> lane(int local) const;
  // "2 hosts x 2 ranks", "3 hosts (2, 1, 1 ranks)".
  std::string describe() const;

 private:
  std::vector<int> host_of_;
  std::vector<int> local_rank_;
  std::vector<std::vector<int>> members_;
  int per_host_ = 0;
};

// This process's host key (computed once): a 64-bit hash (FNV-1a) of the
// hostname, the kernel's boot id and the inodes of its pid and IPC
// namespaces. Processes with equal keys run on one kernel in the same
// namespaces, so they can share memory; the hostname and the IPC namespace
// tell apart the hosts of one machine that scripts/cluster simulates.
uint64_t this_host_key();

inline bool is_pow2(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}
int floor_pow2(int n);
int ceil_log2(int n);

}  // namespace rdmaflow
