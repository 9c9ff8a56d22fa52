// BfcPool: best-fit with coalescing over a set of address ranges (slabs), the
// idea of TensorFlow's BFC allocator.
//
// Every slab is tiled by blocks, each free or in use. Free blocks are indexed by
// (size, address), so allocation takes the smallest block that fits (lowest
// address among equals) and splits off what it does not need; blocks are
// indexed by address, so a free merges with free neighbours of the same slab
// and no two free blocks are ever adjacent. All addresses and sizes are
// multiples of kGranule. The pool only does bookkeeping: it never touches the
// memory, and it is not thread-safe (RegisteredArena locks around it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "common/status.h"

namespace rdmaflow {

class BfcPool {
 public:
  static constexpr size_t kGranule = 256;

  struct Block {
    uintptr_t addr = 0;
    size_t size = 0;
    uint64_t slab = 0;  // id given to add_slab
    bool free = false;
  };

  // Adds [base, base + length) as one free block. base and length are
  // multiples of kGranule and the range overlaps no other slab.
  void add_slab(uint64_t slab, uintptr_t base, size_t length);

  // Removes the slab at `base` if it is entirely free; false otherwise.
  bool remove_slab(uintptr_t base);

  // Takes the best-fitting free block for `size` bytes (a positive multiple of
  // kGranule) at `alignment` (a power of two >= kGranule); nullopt if none fits.
  std::optional<Block> allocate(size_t size, size_t alignment);

  // True if allocate(size, alignment) would succeed.
  bool fits(size_t size, size_t alignment) const;

  // Frees the in-use block starting at `addr` and returns the free block it
  // merged into; nullopt if `addr` is not the start of an in-use block.
  std::optional<Block> free(uintptr_t addr);

  // The block (free or in use) containing `addr`, if any slab does.
  std::optional<Block> block_containing(uintptr_t addr) const;

  // True if the slab at `base` is one free block.
  bool slab_is_free(uintptr_t base) const;

  size_t bytes_in_use() const { return bytes_in_use_; }
  size_t blocks_in_use() const { return blocks_in_use_; }
  size_t free_block_count() const { return free_by_size_.size(); }
  size_t largest_free_block() const {
    return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  }

  // Checks every invariant (tiling, no adjacent free blocks, index agreement,
  // counters); O(blocks). For tests and debugging.
  Status validate() const;

 private:
  struct Meta {
    size_t size;
    uint64_t slab;
    bool free;
  };
  struct SlabRange {
    uint64_t id;
    size_t length;
  };

  using FreeIndex = std::set<std::pair<size_t, uintptr_t>>;

  void insert_free(uintptr_t addr, size_t size, uint64_t slab);
  // The best-fitting free block and the aligned address inside it.
  std::optional<std::pair<FreeIndex::const_iterator, uintptr_t>> best_fit(size_t size,
                                                                          size_t alignment) const;

  std::map<uintptr_t, SlabRange> slabs_;  // by base
  std::map<uintptr_t, Meta> blocks_;      // every block, by address
  FreeIndex free_by_size_;                // free blocks, best fit first
  size_t bytes_in_use_ = 0;
  size_t blocks_in_use_ = 0;
};

}  // namespace rdmaflow
