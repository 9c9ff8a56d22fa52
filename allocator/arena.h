// RegisteredArena: the memory every tensor that crosses a process boundary
// lives in. It maps large 2 MiB-aligned slabs (allocator/slab.h), registers
// each slab exactly once with every attached transport (allocator/registrar.h),
// and carves allocations out of them with best-fit and coalescing
// (allocator/bfc.h). A transfer then needs no per-tensor registration: any
// allocation lies inside a region every transport already knows.
//
// Knobs (explicit ArenaOptions win over the environment):
//   RDMAFLOW_ARENA_SLAB_MB  size of a regular slab (default 64). A request that
//                           does not fit one gets its own slab, sized to fit.
//   RDMAFLOW_ARENA_MAX_MB   cap on bytes mapped by slabs (default 0 = no cap);
//                           beyond it allocate() fails with kResourceExhausted.
//
// Thread model: every public method takes one internal mutex, so an arena may
// be shared by any number of threads. Registrar callbacks (register_memory /
// deregister_memory) run with that mutex held: they must not call back into
// the same arena. Registrars must be detached before they are destroyed, or
// outlive the arena (its destructor deregisters every slab).
//
// With AddressSanitizer, free space is poisoned, so a stray access to memory
// that is not currently allocated is reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "allocator/bfc.h"
#include "allocator/registrar.h"
#include "allocator/slab.h"
#include "common/status.h"

namespace rdmaflow {

struct ArenaOptions {
  // Names the arena in errors and logs.
  std::string name = "arena";
  // Regular slab size, rounded up to 2 MiB. Unset: RDMAFLOW_ARENA_SLAB_MB, else 64 MiB.
  std::optional<size_t> slab_bytes;
  // Cap on bytes mapped by slabs; 0 = no cap. Unset: RDMAFLOW_ARENA_MAX_MB, else no cap.
  std::optional<size_t> max_bytes;
  // Alignment when allocate() is given 0; a power of two in [1, 2 MiB].
  size_t default_alignment = 256;
  HugePages huge_pages = HugePages::kAuto;
  // How many entirely free slabs stay mapped (and registered) for reuse. A slab
  // that becomes free while this many others are already free is released
  // (deregistered, unmapped) at once. Default 1: a workload that oscillates
  // across a slab boundary does not map and register a slab every step.
  size_t retain_empty_slabs = 1;
};

// One allocation. Allocations never move; `ptr` stays valid until free(ptr).
struct Allocation {
  void* ptr = nullptr;
  size_t size = 0;      // bytes requested
  size_t capacity = 0;  // bytes reserved for it (>= size, a multiple of 256); all usable
  uint64_t slab = 0;    // id of the slab it lies in (ids are never reused)
  size_t offset = 0;    // ptr - slab base
};

// The region one registrar returned for one slab.
struct SlabRegion {
  MemoryRegistrar* registrar = nullptr;
  RegionId region = 0;
};

struct SlabInfo {
  uint64_t id = 0;
  void* base = nullptr;
  size_t length = 0;
  PageKind pages = PageKind::kNormal;
  std::vector<SlabRegion> regions;  // one per attached registrar, in attach order

  std::optional<RegionId> region_for(const MemoryRegistrar* registrar) const;
};

struct ArenaStats {
  size_t bytes_in_use = 0;        // capacity of live allocations
  size_t peak_bytes_in_use = 0;   // high-water mark of bytes_in_use
  size_t live_allocations = 0;    // allocations not yet freed
  uint64_t allocation_count = 0;  // successful allocate() calls, ever
  uint64_t failed_allocations = 0;
  size_t bytes_reserved = 0;  // bytes mapped by slabs now
  size_t peak_bytes_reserved = 0;
  size_t slab_count = 0;
  uint64_t slabs_mapped = 0;    // ever
  uint64_t slabs_released = 0;  // ever
  size_t huge_page_slabs = 0;   // slabs now backed by hugetlb or THP-advised
  size_t largest_free_block = 0;
  size_t free_blocks = 0;        // after full coalescing, equals slab_count when nothing is live
  size_t registrars = 0;         // attached now
  uint64_t registrations = 0;    // successful register_memory calls, ever
  uint64_t deregistrations = 0;  // deregister_memory calls, ever

  // One line for logs: "in use 1.5 MiB (peak 3 MiB) in 12 allocations, ...".
  std::string to_string() const;
};

class RegisteredArena {
 public:
  static constexpr size_t kDefaultSlabBytes = size_t{64} << 20;
  static constexpr size_t kMinAlignment = BfcPool::kGranule;  // every block is 256 B aligned
  static constexpr size_t kMaxAlignment = kSlabAlignment;     // 2 MiB

  // Resolves unset options from the environment and validates them; a
  // malformed knob is kInvalidArgument naming it. Maps nothing yet.
  static Result<std::unique_ptr<RegisteredArena>> create(ArenaOptions options = {});

  // Deregisters every slab from every attached registrar and unmaps it.
  ~RegisteredArena();
  RegisteredArena(const RegisteredArena&) = delete;
  RegisteredArena& operator=(const RegisteredArena&) = delete;

  // Registers every existing slab with `registrar`, and every later slab too,
  // until detach(). If one registration fails, those already made by this call
  // are undone, the registrar is not attached, and its status is returned.
  Status attach(MemoryRegistrar* registrar);

  // Deregisters every slab from `registrar` and forgets it. The registrar is
  // detached even if a deregistration fails; the first failure is returned.
  Status detach(MemoryRegistrar* registrar);

  // `bytes` at `alignment` (a power of two up to 2 MiB; 0 = the default
  // alignment; anything below 256 B is rounded up to 256 B). Maps and
  // registers a new slab when no free block fits. Errors: kInvalidArgument
  // (bad alignment), kResourceExhausted (RDMAFLOW_ARENA_MAX_MB reached or mmap
  // refused), or the failing registrar's own status (the new slab is then
  // deregistered from the others and unmapped).
  //
  // Zero bytes: returns a distinct, non-null, aligned pointer with a 256 B
  // capacity inside registered memory (useful as the target of an empty
  // transfer); like any allocation it must be freed.
  Result<Allocation> allocate(size_t bytes, size_t alignment = 0);

  // Returns the allocation starting at `ptr`. free(nullptr) is a no-op. A
  // pointer the arena never returned, one into the middle of an allocation, or
  // a second free is refused (kNotFound / kInvalidArgument) and changes nothing.
  Status free(void* ptr);
  Status free(const Allocation& allocation) { return free(allocation.ptr); }

  // Makes sure a request of `bytes` at the default alignment will not need a
  // new slab (maps and registers one now if it would), e.g. before connecting.
  Status reserve(size_t bytes);

  // Releases every entirely free slab now, regardless of retain_empty_slabs.
  // Returns how many were released.
  size_t release_free_slabs();

  // The slab holding all of [ptr, ptr + len) (len 0 counts as 1); kNotFound if
  // the range is not inside one slab.
  Result<SlabInfo> find_slab(const void* ptr, size_t len = 1) const;
  bool contains(const void* ptr, size_t len) const;
  // The region `registrar` returned for the slab holding [ptr, ptr + len).
  Result<RegionId> region_of(const MemoryRegistrar* registrar, const void* ptr, size_t len) const;
  std::vector<SlabInfo> slabs() const;  // by address

  ArenaStats stats() const;
  std::string to_string() const;  // "arena 'name': <stats>"

  // Checks internal consistency (block tiling, indexes, counters); kInternal
  // naming the broken invariant. O(blocks); for tests and debugging.
  Status validate() const;

  const std::string& name() const { return options_.name; }
  size_t slab_bytes() const { return *options_.slab_bytes; }
  size_t max_bytes() const { return *options_.max_bytes; }  // 0 = no cap

 private:
  struct Slab {
    uint64_t id = 0;
    MappedSlab mapping;
    std::vector<SlabRegion> regions;
  };

  explicit RegisteredArena(ArenaOptions options) : options_(std::move(options)) {}

  // All below run with mu_ held.
  Status grow_locked(size_t block_bytes, const char* op);
  Status register_slab_locked(Slab& slab);
  void release_slab_locked(std::map<uintptr_t, Slab>::iterator it);
  size_t free_slab_count_locked() const;
  const Slab* slab_for_locked(uintptr_t addr, size_t len) const;
  SlabInfo info_locked(const Slab& slab) const;
  ArenaStats stats_locked() const;

  const ArenaOptions options_;  // fully resolved by create()

  mutable std::mutex mu_;
  BfcPool pool_;
  std::map<uintptr_t, Slab> slabs_;  // by base address
  std::vector<MemoryRegistrar*> registrars_;
  uint64_t next_slab_id_ = 0;
  bool hugetlb_failed_ = false;  // stop asking for MAP_HUGETLB once the pool was empty

  size_t bytes_reserved_ = 0;
  size_t peak_bytes_reserved_ = 0;
  size_t peak_bytes_in_use_ = 0;
  uint64_t allocation_count_ = 0;
  uint64_t failed_allocations_ = 0;
  uint64_t slabs_mapped_ = 0;
  uint64_t slabs_released_ = 0;
  uint64_t registrations_ = 0;
  uint64_t deregistrations_ = 0;
};

}  // namespace rdmaflow
