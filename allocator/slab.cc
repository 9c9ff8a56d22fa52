#include "allocator/slab.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "common/log.h"

namespace rdmaflow {

std::string_view page_kind_name(PageKind kind) {
  switch (kind) {
    case PageKind::kNormal:
      return "normal pages";
    case PageKind::kTransparentHuge:
      return "transparent huge pages";
    case PageKind::kHugeTlb:
      return "hugetlb 2 MiB pages";
  }
  return "unknown";
}

MappedSlab::MappedSlab(MappedSlab&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      length_(std::exchange(other.length_, 0)),
      kind_(other.kind_) {}

MappedSlab& MappedSlab::operator=(MappedSlab&& other) noexcept {
  if (this != &other) {
    unmap();
    base_ = std::exchange(other.base_, nullptr);
    length_ = std::exchange(other.length_, 0);
    kind_ = other.kind_;
  }
  return *this;
}

void MappedSlab::unmap() {
  if (base_ == nullptr) return;
  if (::munmap(base_, length_) != 0) {
    RDMAFLOW_LOG_WARN("munmap({}, {}) failed: {}", base_, length_, std::strerror(errno));
  }
  base_ = nullptr;
  length_ = 0;
}

namespace {

// Explicit 2 MiB huge pages. Fails (ENOMEM) when the hugetlbfs pool is empty,
// which is the default on most machines.
void* map_hugetlb(size_t length) {
#ifdef MAP_HUGETLB
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
#ifdef MAP_HUGE_SHIFT
  flags |= 21 << MAP_HUGE_SHIFT;  // 2 MiB, whatever the default huge page size is
#endif
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (reinterpret_cast<uintptr_t>(p) % kSlabAlignment != 0) {  // never expected
    ::munmap(p, length);
    return nullptr;
  }
  return p;
#else
  (void)length;
  errno = ENOTSUP;
  return nullptr;
#endif
}

}  // namespace

Result<MappedSlab> MappedSlab::map(size_t length, HugePages mode, bool try_hugetlb) {
  if (length == 0 || length % kSlabAlignment != 0 || length > (size_t{1} << 50)) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "map slab", -1,
        "length " + std::to_string(length) + " is not a positive multiple of 2 MiB below 1 PiB");
  }

  if (mode == HugePages::kAuto && try_hugetlb) {
    if (void* p = map_hugetlb(length); p != nullptr) {
      return MappedSlab(p, length, PageKind::kHugeTlb);
    }
    RDMAFLOW_LOG_DEBUG("MAP_HUGETLB for a {} B slab unavailable ({}); using THP instead", length,
                       std::strerror(errno));
  }

  // Over-map by one alignment unit, then trim the unaligned head and the tail.
  const size_t span = length + kSlabAlignment;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    int err = errno;
    return RDMAFLOW_ERROR(Code::kResourceExhausted, "map slab", -1,
                          "mmap of " + std::to_string(span) + " B failed: " + std::strerror(err));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kSlabAlignment - 1) & ~(kSlabAlignment - 1);
  const size_t head = aligned - start;
  const size_t tail = span - head - length;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* base = reinterpret_cast<void*>(aligned);

  PageKind kind = PageKind::kNormal;
#ifdef MADV_HUGEPAGE
  if (mode != HugePages::kOff) {
    if (::madvise(base, length, MADV_HUGEPAGE) == 0) {
      kind = PageKind::kTransparentHuge;
    } else {
      RDMAFLOW_LOG_DEBUG("madvise(MADV_HUGEPAGE) on a {} B slab refused ({}); using base pages",
                         length, std::strerror(errno));
    }
  }
#endif
  return MappedSlab(base, length, kind);
}

}  // namespace rdmaflow
