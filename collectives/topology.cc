#include "collectives/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string_view>

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

namespace {

// FNV-1a over `bytes`, then a separator byte so that ("ab", "c") and ("a",
// "bc") hash differently.
uint64_t fnv1a(uint64_t h, std::string_view bytes) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  h ^= 0xFF;
  return h * 0x100000001b3ull;
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string inode_of(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? std::to_string(st.st_ino) : std::string();
}

}  // namespace

uint64_t this_host_key() {
  static const uint64_t key = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, host);
    h = fnv1a(h, first_line("/proc/sys/kernel/random/boot_id"));
    h = fnv1a(h, inode_of("/proc/self/ns/pid"));
    return fnv1a(h, inode_of("/proc/self/ns/ipc"));
  }();
  return key;
}

HostGroups::HostGroups(std::span<const uint64_t> keys) {
  std::map<uint64_t, int> index;
  host_of_.resize(keys.size());
  local_rank_.resize(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    auto [it, fresh] = index.emplace(keys[r], static_cast<int>(members_.size()));
    if (fresh) members_.emplace_back();
    const int h = it->second;
    host_of_[r] = h;
    local_rank_[r] = static_cast<int>(members_[h].size());
    members_[h].push_back(static_cast<int>(r));
  }
  per_host_ = members_.empty() ? 0 : local_size(0);
  for (const auto& m : members_) {
    if (static_cast<int>(m.size()) != per_host_) per_host_ = 0;
  }
}

HostGroups HostGroups::single_host(int world) {
  return HostGroups(std::vector<uint64_t>(static_cast<size_t>(world), 0));
}

HostGroups HostGroups::uniform(int hosts, int per_host) {
  std::vector<uint64_t> keys;
  for (int h = 0; h < hosts; ++h) keys.insert(keys.end(), static_cast<size_t>(per_host), h);
  return HostGroups(keys);
}

std::vector<int> HostGroups::lane(int local) const {
  std::vector<int> out;
  for (const auto& m : members_) {
    if (local < static_cast<int>(m.size())) out.push_back(m[local]);
  }
  return out;
}

std::string HostGroups::describe() const {
  std::string s = std::to_string(hosts()) + (hosts() == 1 ? " host" : " hosts");
  if (per_host_ > 0)
    return s + " x " + std::to_string(per_host_) + (per_host_ == 1 ? " rank" : " ranks");
  s += " (";
  for (int h = 0; h < hosts(); ++h) s += (h ? ", " : "") + std::to_string(local_size(h));
  return s + " ranks)";
}

}  // namespace rdmaflow
