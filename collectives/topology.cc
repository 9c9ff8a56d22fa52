#include "collectives/topology.h"

namespace rdmaflow {

int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

TreeNode binomial_tree(int world, int rank, int root) {
  TreeNode node;
  const int vr = (rank - root + world) % world;
  int mask = 1;
  while (mask < world) {
    if (vr & mask) {
      node.parent = ((vr - mask) + root) % world;
      break;
    }
    const int child = vr + mask;
    if (child < world) node.children.push_back((child + root) % world);
    mask <<= 1;
  }
  return node;
}

TreeNode binary_tree(int world, int rank) {
  TreeNode node;
  if (world <= 1) return node;
  int bit = 1;
  while (bit < world && !(bit & rank)) bit <<= 1;
  if (rank == 0) {
    node.children.push_back(bit >> 1);  // the largest power of two below world
    return node;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= world) up = rank ^ bit;
  node.parent = up;
  int low = bit >> 1;
  if (low > 0) node.children.push_back(rank - low);
  while (low > 0 && rank + low >= world) low >>= 1;
  if (low > 0) node.children.push_back(rank + low);
  return node;
}

namespace {

TreeNode map_tree(const TreeNode& t, int world, bool mirror) {
  auto map = [&](int r) {
    if (r < 0) return r;
    return mirror ? world - 1 - r : (r + 1) % world;
  };
  TreeNode out;
  out.parent = map(t.parent);
  for (int c : t.children) out.children.push_back(map(c));
  return out;
}

}  // namespace

DoubleTree double_binary_tree(int world, int rank) {
  DoubleTree dt;
  dt.first = binary_tree(world, rank);
  if (world % 2 == 1) {
    dt.second = map_tree(binary_tree(world, (rank - 1 + world) % world), world, false);
  } else {
    dt.second = map_tree(binary_tree(world, world - 1 - rank), world, true);
  }
  return dt;
}

Fold make_fold(int world, int rank) {
  Fold f;
  f.pof2 = floor_pow2(world);
  f.rem = world - f.pof2;
  if (rank < 2 * f.rem) {
    f.partner = rank ^ 1;
    f.vrank = (rank % 2 == 0) ? -1 : rank / 2;
  } else {
    f.vrank = rank - f.rem;
  }
  return f;
}

int fold_real_rank(const Fold& f, int v) {
  return v < f.rem ? 2 * v + 1 : v + f.rem;
}
int fold_first_real(const Fold& f, int v) {
  return v < f.rem ? 2 * v : v + f.rem;
}
int fold_last_real(const Fold& f, int v) {
  return v < f.rem ? 2 * v + 1 : v + f.rem;
}

}  // namespace rdmaflow
