#include "allocator/bfc.h"

#include <cstdio>
#include <iterator>
#include <string>

namespace rdmaflow {

namespace {
std::string hex(uintptr_t v) {
  char buf[2 + 16 + 1];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

void BfcPool::insert_free(uintptr_t addr, size_t size, uint64_t slab) {
  blocks_[addr] = Meta{size, slab, true};
  free_by_size_.emplace(size, addr);
}

void BfcPool::add_slab(uint64_t slab, uintptr_t base, size_t length) {
  slabs_.emplace(base, SlabRange{slab, length});
  insert_free(base, length, slab);
}

bool BfcPool::remove_slab(uintptr_t base) {
  if (!slab_is_free(base)) return false;
  free_by_size_.erase({slabs_.at(base).length, base});
  blocks_.erase(base);
  slabs_.erase(base);
  return true;
}

bool BfcPool::slab_is_free(uintptr_t base) const {
  auto s = slabs_.find(base);
  if (s == slabs_.end()) return false;
  auto b = blocks_.find(base);
  return b != blocks_.end() && b->second.free && b->second.size == s->second.length;
}

std::optional<std::pair<BfcPool::FreeIndex::const_iterator, uintptr_t>> BfcPool::best_fit(
    size_t size, size_t alignment) const {
  // Smallest block first. A block of at least size + alignment - kGranule always
  // fits (block addresses are kGranule aligned), so the scan past blocks that
  // only fail on alignment is short.
  for (auto it = free_by_size_.lower_bound({size, 0}); it != free_by_size_.end(); ++it) {
    const auto [block_size, addr] = *it;
    const uintptr_t aligned = (addr + alignment - 1) & ~(uintptr_t{alignment} - 1);
    const size_t pad = aligned - addr;
    if (pad <= block_size && block_size - pad >= size) return std::make_pair(it, aligned);
  }
  return std::nullopt;
}

bool BfcPool::fits(size_t size, size_t alignment) const {
  return best_fit(size, alignment).has_value();
}

std::optional<BfcPool::Block> BfcPool::allocate(size_t size, size_t alignment) {
  auto fit = best_fit(size, alignment);
  if (!fit) return std::nullopt;
  const auto [block_size, addr] = *fit->first;
  const uintptr_t aligned = fit->second;
  const size_t pad = aligned - addr;
  free_by_size_.erase(fit->first);

  Meta& meta = blocks_.at(addr);
  const uint64_t slab = meta.slab;
  if (pad > 0) {
    // The head stays free; its left neighbour is in use (no adjacent free blocks).
    meta.size = pad;
    free_by_size_.emplace(pad, addr);
  }
  blocks_[aligned] = Meta{size, slab, false};
  if (const size_t tail = block_size - pad - size; tail > 0) {
    insert_free(aligned + size, tail, slab);
  }
  bytes_in_use_ += size;
  ++blocks_in_use_;
  return Block{aligned, size, slab, false};
}

std::optional<BfcPool::Block> BfcPool::free(uintptr_t addr) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.free) return std::nullopt;
  bytes_in_use_ -= it->second.size;
  --blocks_in_use_;
  it->second.free = true;
  const uint64_t slab = it->second.slab;

  // Absorb the right neighbour.
  if (auto next = std::next(it); next != blocks_.end() && next->second.free &&
                                 next->second.slab == slab &&
                                 next->first == addr + it->second.size) {
    free_by_size_.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  // Let the left neighbour absorb us.
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.slab == slab && prev->first + prev->second.size == addr) {
      free_by_size_.erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_by_size_.emplace(it->second.size, it->first);
  return Block{it->first, it->second.size, slab, true};
}

std::optional<BfcPool::Block> BfcPool::block_containing(uintptr_t addr) const {
  auto it = blocks_.upper_bound(addr);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (addr - it->first >= it->second.size) return std::nullopt;
  return Block{it->first, it->second.size, it->second.slab, it->second.free};
}

Status BfcPool::validate() const {
  auto fail = [](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInternal, "validate arena blocks", -1, why);
  };
  size_t in_use = 0;
  size_t used_blocks = 0;
  size_t free_blocks = 0;
  auto block = blocks_.begin();
  for (const auto& [base, range] : slabs_) {
    if (block == blocks_.end() || block->first != base) {
      return fail("slab " + std::to_string(range.id) + " at " + hex(base) +
                  " does not start with a block");
    }
    uintptr_t expect = base;
    bool prev_free = false;
    while (block != blocks_.end() && block->first < base + range.length) {
      const auto& [addr, meta] = *block;
      if (addr != expect)
        return fail("gap or overlap at " + hex(addr) + ", expected " + hex(expect));
      if (meta.slab != range.id) return fail("block " + hex(addr) + " has the wrong slab id");
      if (meta.size == 0 || meta.size % kGranule != 0 || addr % kGranule != 0) {
        return fail("block " + hex(addr) + " size " + std::to_string(meta.size) +
                    " breaks the granule");
      }
      if (meta.free) {
        if (prev_free) return fail("adjacent free blocks at " + hex(addr));
        if (free_by_size_.count({meta.size, addr}) == 0) {
          return fail("free block " + hex(addr) + " missing from the size index");
        }
        ++free_blocks;
      } else {
        in_use += meta.size;
        ++used_blocks;
      }
      prev_free = meta.free;
      expect = addr + meta.size;
      ++block;
    }
    if (expect != base + range.length) {
      return fail("blocks of slab " + std::to_string(range.id) + " end at " + hex(expect) +
                  ", slab ends at " + hex(base + range.length));
    }
  }
  if (block != blocks_.end()) return fail("block " + hex(block->first) + " lies outside all slabs");
  if (free_blocks != free_by_size_.size()) {
    return fail("size index holds " + std::to_string(free_by_size_.size()) + " entries, " +
                std::to_string(free_blocks) + " free blocks exist");
  }
  if (in_use != bytes_in_use_ || used_blocks != blocks_in_use_) {
    return fail("counters say " + std::to_string(bytes_in_use_) + " B in " +
                std::to_string(blocks_in_use_) + " blocks, blocks say " + std::to_string(in_use) +
                " B in " + std::to_string(used_blocks));
  }
  return Status::ok();
}

}  // namespace rdmaflow
