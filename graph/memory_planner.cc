#include "graph/memory_planner.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <utility>

namespace rdmaflow::graph {

namespace {

// Free blocks, findable by offset (to coalesce) and by size (to best-fit).
class FreeList {
 public:
  explicit FreeList(uint64_t* top) : top_(top) {}

  uint64_t allocate(uint64_t size) {
    auto it = by_size_.lower_bound({size, 0});
    if (it != by_size_.end()) {
      auto [block, off] = *it;
      erase(off, block);
      if (block > size) insert(off + size, block - size);
      return off;
    }
    // Nothing fits: grow the arena, reusing a free block that touches the top.
    if (!by_off_.empty()) {
      auto last = std::prev(by_off_.end());
      if (last->first + last->second == *top_) {
        uint64_t off = last->first;
        erase(off, last->second);
        *top_ = off + size;
        return off;
      }
    }
    uint64_t off = *top_;
    *top_ += size;
    return off;
  }

  void release(uint64_t off, uint64_t size) {
    auto next = by_off_.lower_bound(off);
    if (next != by_off_.end() && off + size == next->first) {
      uint64_t n = next->second;
      erase(next->first, n);
      size += n;
    }
    auto after = by_off_.lower_bound(off);
    if (after != by_off_.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == off) {
        uint64_t p_off = prev->first, p_size = prev->second;
        erase(p_off, p_size);
        off = p_off;
        size += p_size;
      }
    }
    insert(off, size);
  }

 private:
  void insert(uint64_t off, uint64_t size) {
    by_off_.emplace(off, size);
    by_size_.emplace(size, off);
  }
  void erase(uint64_t off, uint64_t size) {
    by_off_.erase(off);
    by_size_.erase({size, off});
  }

  uint64_t* top_;
  std::map<uint64_t, uint64_t> by_off_;
  std::set<std::pair<uint64_t, uint64_t>> by_size_;
};

}  // namespace

MemoryLayout plan_memory(const std::vector<MemoryRequest>& requests, uint64_t alignment) {
  const size_t n = requests.size();
  MemoryLayout out;
  out.offset.assign(n, 0);
  out.reserved.resize(n);
  std::vector<int32_t> end(n);
  for (size_t i = 0; i < n; ++i) {
    out.reserved[i] = align_up(std::max<uint64_t>(requests[i].size, 1), alignment);
    out.bytes_without_reuse += out.reserved[i];
    end[i] = std::max(requests[i].end, requests[i].begin + 1);
  }
  // Placement order: by begin, then largest first, then request order.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (requests[a].begin != requests[b].begin) return requests[a].begin < requests[b].begin;
    if (out.reserved[a] != out.reserved[b]) return out.reserved[a] > out.reserved[b];
    return a < b;
  });
  FreeList free_list(&out.arena_bytes);
  using Live = std::pair<int32_t, size_t>;  // (end, request)
  std::priority_queue<Live, std::vector<Live>, std::greater<>> live;
  for (size_t i : order) {
    const int32_t now = requests[i].begin;
    while (!live.empty() && live.top().first <= now) {
      size_t j = live.top().second;
      live.pop();
      free_list.release(out.offset[j], out.reserved[j]);
    }
    out.offset[i] = free_list.allocate(out.reserved[i]);
    live.emplace(end[i], i);
  }
  return out;
}

}  // namespace rdmaflow::graph
