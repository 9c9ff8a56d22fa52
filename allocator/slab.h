// MappedSlab: one large anonymous mapping, aligned to 2 MiB, that the arena
// carves tensors out of and registers once with every transport.
//
// 2 MiB alignment lets the kernel back the slab with huge pages (fewer TLB and
// NIC translation entries for registered memory) and lets any supported
// allocation alignment be met at offset 0. The slab is mapped with
// MAP_HUGETLB when asked and the hugetlbfs pool has pages; otherwise it is
// over-mapped by 2 MiB, trimmed to an aligned window and advised with
// MADV_HUGEPAGE (transparent huge pages). Every fallback is quiet (debug log).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace rdmaflow {

inline constexpr size_t kSlabAlignment = size_t{2} << 20;  // 2 MiB

enum class HugePages : uint8_t {
  kOff,          // plain pages (still 2 MiB aligned)
  kTransparent,  // madvise(MADV_HUGEPAGE) only
  kAuto,         // MAP_HUGETLB if the pool has pages, else madvise(MADV_HUGEPAGE)
};

// What the kernel actually gave us.
enum class PageKind : uint8_t {
  kNormal,           // base pages; MADV_HUGEPAGE not requested or refused
  kTransparentHuge,  // MADV_HUGEPAGE accepted (khugepaged / fault path may use 2 MiB pages)
  kHugeTlb,          // explicit 2 MiB huge pages from the hugetlbfs pool
};

std::string_view page_kind_name(PageKind kind);

class MappedSlab {
 public:
  MappedSlab() = default;
  ~MappedSlab() { unmap(); }
  MappedSlab(MappedSlab&& other) noexcept;
  MappedSlab& operator=(MappedSlab&& other) noexcept;
  MappedSlab(const MappedSlab&) = delete;
  MappedSlab& operator=(const MappedSlab&) = delete;

  // Maps `length` bytes (a positive multiple of kSlabAlignment), read/write,
  // private and anonymous (zero-filled), at a kSlabAlignment-aligned address.
  // `try_hugetlb` lets the caller skip MAP_HUGETLB after it failed once.
  // Fails with kResourceExhausted when the kernel refuses the mapping.
  static Result<MappedSlab> map(size_t length, HugePages mode, bool try_hugetlb = true);

  void* base() const { return base_; }
  size_t length() const { return length_; }
  PageKind page_kind() const { return kind_; }
  bool mapped() const { return base_ != nullptr; }

  // Releases the mapping (idempotent).
  void unmap();

 private:
  MappedSlab(void* base, size_t length, PageKind kind)
      : base_(base), length_(length), kind_(kind) {}

  void* base_ = nullptr;
  size_t length_ = 0;
  PageKind kind_ = PageKind::kNormal;
};

}  // namespace rdmaflow
