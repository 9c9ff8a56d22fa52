// Offline placement of buffers with known lifetimes in one arena.
//
// Buffers whose lifetimes [begin, end) do not overlap may share bytes. The
// planner replays the step in time order: at each instant it first frees the
// buffers that ended, then places the ones that begin, largest first, in the
// best-fitting free block (smallest that fits, lowest offset on ties), growing
// the arena only when no free block fits. O(n log n), deterministic.
#pragma once

#include <cstdint>
#include <vector>

namespace rdmaflow::graph {

struct MemoryRequest {
  uint64_t size = 0;  // bytes; reserved rounded up to the alignment (and at least one unit)
  int32_t begin = 0;
  int32_t end = 0;  // exclusive; end <= begin is treated as begin + 1
};

struct MemoryLayout {
  std::vector<uint64_t> offset;      // per request, a multiple of the alignment
  std::vector<uint64_t> reserved;    // per request: the bytes set aside for it
  uint64_t arena_bytes = 0;          // with reuse
  uint64_t bytes_without_reuse = 0;  // sum of reserved
};

// `alignment` must be a power of two.
MemoryLayout plan_memory(const std::vector<MemoryRequest>& requests, uint64_t alignment);

// Rounds up to a multiple of a power-of-two alignment.
inline uint64_t align_up(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

}  // namespace rdmaflow::graph
