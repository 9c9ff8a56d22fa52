#include "allocator/arena.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <utility>

#include "common/env.h"
#include "common/log.h"

#if defined(__SANITIZE_ADDRESS__)
#define RDMAFLOW_ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMAFLOW_ARENA_ASAN 1
#endif
#endif

#ifdef RDMAFLOW_ARENA_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace rdmaflow {

namespace {

// Free space is poisoned under ASan; it must be unpoisoned before munmap, or a
// later mapping at the same address would inherit the poison.
void poison(uintptr_t addr, size_t len) {
#ifdef RDMAFLOW_ARENA_ASAN
  ASAN_POISON_MEMORY_REGION(reinterpret_cast<void*>(addr), len);
#else
  (void)addr;
  (void)len;
#endif
}

void unpoison(uintptr_t addr, size_t len) {
#ifdef RDMAFLOW_ARENA_ASAN
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(addr), len);
#else
  (void)addr;
  (void)len;
#endif
}

constexpr size_t kMiB = size_t{1} << 20;
constexpr int64_t kMaxKnobMb = int64_t{1} << 30;  // 1 PiB
constexpr size_t kMaxRequest = size_t{1} << 50;   // 1 PiB; keeps rounding overflow-free

constexpr bool is_power_of_two(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
constexpr size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

std::string hex(uintptr_t v) {
  char buf[2 + 16 + 1];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// "300 B", "1.5 KiB", "64 MiB".
std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof(buf), "%llu %s", static_cast<unsigned long long>(v), kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  }
  return buf;
}

// Reads a size knob in MiB; `allow_zero` for caps where 0 means "none".
Result<size_t> env_mib(const char* name, int64_t fallback, bool allow_zero, const std::string& op) {
  auto mb = env_int(name, fallback);
  if (!mb.is_ok()) return mb.status().with_op(op);
  if (*mb < (allow_zero ? 0 : 1) || *mb > kMaxKnobMb) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          std::string(name) + "=" + std::to_string(*mb) + " must be between " +
                              (allow_zero ? "0 (no cap)" : "1") + " and " +
                              std::to_string(kMaxKnobMb) + " MiB");
  }
  return static_cast<size_t>(*mb) * kMiB;
}

}  // namespace

std::optional<RegionId> SlabInfo::region_for(const MemoryRegistrar* registrar) const {
  for (const auto& r : regions) {
    if (r.registrar == registrar) return r.region;
  }
  return std::nullopt;
}

std::string ArenaStats::to_string() const {
  return "in use " + format_bytes(bytes_in_use) + " (peak " + format_bytes(peak_bytes_in_use) +
         ") in " + std::to_string(live_allocations) + " live allocations (" +
         std::to_string(allocation_count) + " made, " + std::to_string(failed_allocations) +
         " failed); reserved " + format_bytes(bytes_reserved) + " (peak " +
         format_bytes(peak_bytes_reserved) + ") in " + std::to_string(slab_count) + " slabs (" +
         std::to_string(huge_page_slabs) + " on huge pages; " + std::to_string(slabs_mapped) +
         " mapped, " + std::to_string(slabs_released) + " released); largest free block " +
         format_bytes(largest_free_block) + " of " + std::to_string(free_blocks) +
         " free blocks; " + std::to_string(registrars) + " registrars, " +
         std::to_string(registrations) + " registrations, " + std::to_string(deregistrations) +
         " deregistrations";
}

Result<std::unique_ptr<RegisteredArena>> RegisteredArena::create(ArenaOptions options) {
  const std::string op = "create arena '" + options.name + "'";
  if (!options.slab_bytes) {
    auto v = env_mib("RDMAFLOW_ARENA_SLAB_MB", kDefaultSlabBytes / kMiB, false, op);
    if (!v.is_ok()) return v.status();
    options.slab_bytes = *v;
  }
  if (*options.slab_bytes == 0 || *options.slab_bytes > kMaxRequest) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, -1,
        "slab_bytes " + std::to_string(*options.slab_bytes) + " must be between 1 B and 1 PiB");
  }
  options.slab_bytes = round_up(*options.slab_bytes, kSlabAlignment);

  if (!options.max_bytes) {
    auto v = env_mib("RDMAFLOW_ARENA_MAX_MB", 0, true, op);
    if (!v.is_ok()) return v.status();
    options.max_bytes = *v;
  }
  const size_t alignment = options.default_alignment;
  if (!is_power_of_two(alignment) || alignment > kMaxAlignment) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "default_alignment " + std::to_string(alignment) +
                              " is not a power of two between 1 B and 2 MiB");
  }
  RDMAFLOW_LOG_DEBUG("arena '{}': slabs of {}, cap {}, huge pages {}", options.name,
                     format_bytes(*options.slab_bytes),
                     *options.max_bytes ? format_bytes(*options.max_bytes) : "none",
                     static_cast<int>(options.huge_pages));
  return std::unique_ptr<RegisteredArena>(new RegisteredArena(std::move(options)));
}

RegisteredArena::~RegisteredArena() {
  std::lock_guard lock(mu_);
  if (pool_.blocks_in_use() > 0) {
    RDMAFLOW_LOG_WARN(
        "arena '{}' destroyed with {} live allocations ({}); their memory is unmapped", name(),
        pool_.blocks_in_use(), format_bytes(pool_.bytes_in_use()));
  }
  while (!slabs_.empty()) release_slab_locked(slabs_.begin());
}

Status RegisteredArena::attach(MemoryRegistrar* registrar) {
  if (registrar == nullptr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "attach registrar to arena '" + name() + "'", -1,
                          "registrar is null");
  }
  std::lock_guard lock(mu_);
  const std::string op =
      "attach registrar '" + registrar->registrar_name() + "' to arena '" + name() + "'";
  if (std::find(registrars_.begin(), registrars_.end(), registrar) != registrars_.end()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "it is already attached");
  }
  std::vector<std::pair<Slab*, RegionId>> done;
  for (auto& [base, slab] : slabs_) {
    auto region = registrar->register_memory(slab.mapping.base(), slab.mapping.length());
    if (!region.is_ok()) {
      for (auto& [s, id] : done) {
        ++deregistrations_;
        if (Status st = registrar->deregister_memory(id); !st.is_ok()) {
          RDMAFLOW_LOG_WARN("{}: undoing the registration of slab {} failed: {}", op, s->id,
                            st.to_string());
        }
      }
      const Status& st = region.status();
      return st.with_op(op + ", registering slab " + std::to_string(slab.id) + " of " +
                        format_bytes(slab.mapping.length()) +
                        (st.op().empty() ? std::string() : " (" + st.op() + ")"));
    }
    ++registrations_;
    done.emplace_back(&slab, *region);
  }
  for (auto& [slab, id] : done) slab->regions.push_back(SlabRegion{registrar, id});
  registrars_.push_back(registrar);
  RDMAFLOW_LOG_DEBUG("{}: registered {} existing slabs", op, done.size());
  return Status::ok();
}

Status RegisteredArena::detach(MemoryRegistrar* registrar) {
  std::lock_guard lock(mu_);
  auto it = std::find(registrars_.begin(), registrars_.end(), registrar);
  const std::string op = "detach registrar '" +
                         (registrar ? registrar->registrar_name() : std::string("null")) +
                         "' from arena '" + name() + "'";
  if (registrar == nullptr || it == registrars_.end()) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1, "it is not attached");
  }
  Status first;
  for (auto& [base, slab] : slabs_) {
    auto& regions = slab.regions;
    for (auto r = regions.begin(); r != regions.end();) {
      if (r->registrar != registrar) {
        ++r;
        continue;
      }
      ++deregistrations_;
      if (Status st = registrar->deregister_memory(r->region); !st.is_ok() && first.is_ok()) {
        first = st.with_op(op + ", deregistering slab " + std::to_string(slab.id) +
                           (st.op().empty() ? std::string() : " (" + st.op() + ")"));
      }
      r = regions.erase(r);
    }
  }
  registrars_.erase(it);
  return first;
}

Status RegisteredArena::register_slab_locked(Slab& slab) {
  for (MemoryRegistrar* registrar : registrars_) {
    auto region = registrar->register_memory(slab.mapping.base(), slab.mapping.length());
    if (!region.is_ok()) {
      for (const SlabRegion& done : slab.regions) {
        ++deregistrations_;
        if (Status st = done.registrar->deregister_memory(done.region); !st.is_ok()) {
          RDMAFLOW_LOG_WARN("arena '{}': undoing the registration of slab {} with '{}' failed: {}",
                            name(), slab.id, done.registrar->registrar_name(), st.to_string());
        }
      }
      slab.regions.clear();
      const Status& st = region.status();
      return st.with_op("register a new " + format_bytes(slab.mapping.length()) +
                        " slab of arena '" + name() + "' with '" + registrar->registrar_name() +
                        "'" + (st.op().empty() ? std::string() : " (" + st.op() + ")"));
    }
    ++registrations_;
    slab.regions.push_back(SlabRegion{registrar, *region});
  }
  return Status::ok();
}

Status RegisteredArena::grow_locked(size_t block_bytes, const char* what) {
  const size_t need = round_up(block_bytes, kSlabAlignment);
  size_t length = std::max(slab_bytes(), need);
  if (const size_t cap = max_bytes(); cap != 0 && bytes_reserved_ + length > cap) {
    if (bytes_reserved_ + need > cap) {
      return RDMAFLOW_ERROR(
          Code::kResourceExhausted, std::string(what) + " from arena '" + name() + "'", -1,
          "it needs a new slab of " + format_bytes(need) + " but " + format_bytes(bytes_reserved_) +
              " of the " + format_bytes(cap) +
              " cap (RDMAFLOW_ARENA_MAX_MB / ArenaOptions::max_bytes) are already mapped; " +
              format_bytes(pool_.bytes_in_use()) + " in use, largest free block " +
              format_bytes(pool_.largest_free_block()));
    }
    length = (cap - bytes_reserved_) / kSlabAlignment * kSlabAlignment;  // >= need
  }

  const bool try_hugetlb = !hugetlb_failed_;
  auto mapping = MappedSlab::map(length, options_.huge_pages, try_hugetlb);
  if (!mapping.is_ok()) {
    return mapping.status().with_op(std::string(what) + " from arena '" + name() +
                                    "' (mapping a new slab)");
  }
  if (options_.huge_pages == HugePages::kAuto && try_hugetlb &&
      mapping->page_kind() != PageKind::kHugeTlb) {
    hugetlb_failed_ = true;
  }

  Slab slab{next_slab_id_++, std::move(mapping).value(), {}};
  RDMAFLOW_RETURN_IF_ERROR(register_slab_locked(slab));  // ~Slab unmaps on failure

  const auto base = reinterpret_cast<uintptr_t>(slab.mapping.base());
  poison(base, length);
  pool_.add_slab(slab.id, base, length);
  RDMAFLOW_LOG_DEBUG("arena '{}': mapped slab {} of {} at {} ({}), registered with {} registrars",
                     name(), slab.id, format_bytes(length), hex(base),
                     page_kind_name(slab.mapping.page_kind()), slab.regions.size());
  slabs_.emplace(base, std::move(slab));
  bytes_reserved_ += length;
  peak_bytes_reserved_ = std::max(peak_bytes_reserved_, bytes_reserved_);
  ++slabs_mapped_;
  return Status::ok();
}

void RegisteredArena::release_slab_locked(std::map<uintptr_t, Slab>::iterator it) {
  Slab& slab = it->second;
  for (const SlabRegion& r : slab.regions) {
    ++deregistrations_;
    if (Status st = r.registrar->deregister_memory(r.region); !st.is_ok()) {
      RDMAFLOW_LOG_WARN("arena '{}': deregistering slab {} from '{}' failed: {}", name(), slab.id,
                        r.registrar->registrar_name(), st.to_string());
    }
  }
  (void)pool_.remove_slab(it->first);  // false only in the destructor, with live allocations
  unpoison(it->first, slab.mapping.length());
  bytes_reserved_ -= slab.mapping.length();
  ++slabs_released_;
  RDMAFLOW_LOG_DEBUG("arena '{}': released slab {} of {}", name(), slab.id,
                     format_bytes(slab.mapping.length()));
  slabs_.erase(it);  // unmaps
}

size_t RegisteredArena::free_slab_count_locked() const {
  size_t n = 0;
  for (const auto& [base, slab] : slabs_) n += pool_.slab_is_free(base) ? 1 : 0;
  return n;
}

Result<Allocation> RegisteredArena::allocate(size_t bytes, size_t alignment) {
  if (alignment == 0) alignment = options_.default_alignment;
  if (!is_power_of_two(alignment) || alignment > kMaxAlignment) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument,
        "allocate " + std::to_string(bytes) + " B from arena '" + name() + "'", -1,
        "alignment " + std::to_string(alignment) + " is not a power of two between 1 B and 2 MiB");
  }
  if (bytes > kMaxRequest) {
    std::lock_guard lock(mu_);
    ++failed_allocations_;
    return RDMAFLOW_ERROR(Code::kResourceExhausted,
                          "allocate " + std::to_string(bytes) + " B from arena '" + name() + "'",
                          -1, "requests above 1 PiB are refused");
  }
  const size_t block_bytes = round_up(std::max<size_t>(bytes, 1), kMinAlignment);
  alignment = std::max(alignment, kMinAlignment);

  std::lock_guard lock(mu_);
  auto block = pool_.allocate(block_bytes, alignment);
  if (!block) {
    const std::string what = "allocate " + std::to_string(bytes) + " B";
    if (Status st = grow_locked(block_bytes, what.c_str()); !st.is_ok()) {
      ++failed_allocations_;
      return st;
    }
    block = pool_.allocate(block_bytes, alignment);
    if (!block) {
      ++failed_allocations_;
      return RDMAFLOW_ERROR(Code::kInternal, what + " from arena '" + name() + "'", -1,
                            "a freshly mapped slab did not fit the request");
    }
  }
  ++allocation_count_;
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, pool_.bytes_in_use());
  unpoison(block->addr, block->size);
  const Slab* slab = slab_for_locked(block->addr, block->size);
  const auto base = reinterpret_cast<uintptr_t>(slab->mapping.base());
  return Allocation{reinterpret_cast<void*>(block->addr), bytes, block->size, slab->id,
                    block->addr - base};
}

Status RegisteredArena::free(void* ptr) {
  if (ptr == nullptr) return Status::ok();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mu_);
  auto merged = pool_.free(addr);
  if (!merged) {
    const std::string op = "free " + hex(addr) + " in arena '" + name() + "'";
    auto block = pool_.block_containing(addr);
    if (!block) {
      return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                            "the pointer lies in no slab of this arena (allocated elsewhere, or "
                            "its slab was already released)");
    }
    if (block->free) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "nothing is allocated there: it lies in a free block of " +
                                format_bytes(block->size) + " at " + hex(block->addr) +
                                " (double free?)");
    }
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "the pointer lies " + std::to_string(addr - block->addr) +
                              " B inside the allocation at " + hex(block->addr) + " (" +
                              format_bytes(block->size) +
                              "); free the pointer allocate() returned");
  }
  poison(merged->addr, merged->size);

  // An entirely free slab goes back to the kernel unless it is one of the
  // retain_empty_slabs spares.
  if (auto it = slabs_.find(merged->addr); it != slabs_.end() &&
                                           merged->size == it->second.mapping.length() &&
                                           free_slab_count_locked() > options_.retain_empty_slabs) {
    release_slab_locked(it);
  }
  return Status::ok();
}

Status RegisteredArena::reserve(size_t bytes) {
  if (bytes > kMaxRequest) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted,
                          "reserve " + std::to_string(bytes) + " B in arena '" + name() + "'", -1,
                          "requests above 1 PiB are refused");
  }
  const size_t block_bytes = round_up(std::max<size_t>(bytes, 1), kMinAlignment);
  const size_t alignment = std::max(options_.default_alignment, kMinAlignment);
  std::lock_guard lock(mu_);
  if (pool_.fits(block_bytes, alignment)) return Status::ok();
  const std::string what = "reserve " + std::to_string(bytes) + " B";
  return grow_locked(block_bytes, what.c_str());
}

size_t RegisteredArena::release_free_slabs() {
  std::lock_guard lock(mu_);
  size_t released = 0;
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    auto next = std::next(it);
    if (pool_.slab_is_free(it->first)) {
      release_slab_locked(it);
      ++released;
    }
    it = next;
  }
  return released;
}

const RegisteredArena::Slab* RegisteredArena::slab_for_locked(uintptr_t addr, size_t len) const {
  auto it = slabs_.upper_bound(addr);
  if (it == slabs_.begin()) return nullptr;
  --it;
  const size_t offset = addr - it->first;
  const size_t length = it->second.mapping.length();
  if (offset >= length || std::max<size_t>(len, 1) > length - offset) return nullptr;
  return &it->second;
}

SlabInfo RegisteredArena::info_locked(const Slab& slab) const {
  return SlabInfo{slab.id, slab.mapping.base(), slab.mapping.length(), slab.mapping.page_kind(),
                  slab.regions};
}

Result<SlabInfo> RegisteredArena::find_slab(const void* ptr, size_t len) const {
  std::lock_guard lock(mu_);
  const Slab* slab = slab_for_locked(reinterpret_cast<uintptr_t>(ptr), len);
  if (slab == nullptr) {
    return RDMAFLOW_ERROR(Code::kNotFound, "find slab in arena '" + name() + "'", -1,
                          "[" + hex(reinterpret_cast<uintptr_t>(ptr)) + ", +" +
                              std::to_string(len) + ") does not lie inside one slab");
  }
  return info_locked(*slab);
}

bool RegisteredArena::contains(const void* ptr, size_t len) const {
  std::lock_guard lock(mu_);
  return slab_for_locked(reinterpret_cast<uintptr_t>(ptr), len) != nullptr;
}

Result<RegionId> RegisteredArena::region_of(const MemoryRegistrar* registrar, const void* ptr,
                                            size_t len) const {
  std::lock_guard lock(mu_);
  const std::string op = "find region in arena '" + name() + "'";
  const Slab* slab = slab_for_locked(reinterpret_cast<uintptr_t>(ptr), len);
  if (slab == nullptr) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                          "[" + hex(reinterpret_cast<uintptr_t>(ptr)) + ", +" +
                              std::to_string(len) + ") does not lie inside one slab");
  }
  for (const SlabRegion& r : slab->regions) {
    if (r.registrar == registrar) return r.region;
  }
  return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                        "slab " + std::to_string(slab->id) +
                            " is not registered with that registrar (not attached?)");
}

std::vector<SlabInfo> RegisteredArena::slabs() const {
  std::lock_guard lock(mu_);
  std::vector<SlabInfo> out;
  out.reserve(slabs_.size());
  for (const auto& [base, slab] : slabs_) out.push_back(info_locked(slab));
  return out;
}

ArenaStats RegisteredArena::stats_locked() const {
  ArenaStats s;
  s.bytes_in_use = pool_.bytes_in_use();
  s.peak_bytes_in_use = peak_bytes_in_use_;
  s.live_allocations = pool_.blocks_in_use();
  s.allocation_count = allocation_count_;
  s.failed_allocations = failed_allocations_;
  s.bytes_reserved = bytes_reserved_;
  s.peak_bytes_reserved = peak_bytes_reserved_;
  s.slab_count = slabs_.size();
  s.slabs_mapped = slabs_mapped_;
  s.slabs_released = slabs_released_;
  for (const auto& [base, slab] : slabs_) {
    s.huge_page_slabs += slab.mapping.page_kind() != PageKind::kNormal ? 1 : 0;
  }
  s.largest_free_block = pool_.largest_free_block();
  s.free_blocks = pool_.free_block_count();
  s.registrars = registrars_.size();
  s.registrations = registrations_;
  s.deregistrations = deregistrations_;
  return s;
}

ArenaStats RegisteredArena::stats() const {
  std::lock_guard lock(mu_);
  return stats_locked();
}

std::string RegisteredArena::to_string() const {
  return "arena '" + name() + "': " + stats().to_string();
}

Status RegisteredArena::validate() const {
  std::lock_guard lock(mu_);
  RDMAFLOW_RETURN_IF_ERROR(pool_.validate());
  size_t reserved = 0;
  for (const auto& [base, slab] : slabs_) {
    reserved += slab.mapping.length();
    if (base % kSlabAlignment != 0) {
      return RDMAFLOW_ERROR(Code::kInternal, "validate arena '" + name() + "'", -1,
                            "slab " + std::to_string(slab.id) + " is not 2 MiB aligned");
    }
    if (slab.regions.size() != registrars_.size()) {
      return RDMAFLOW_ERROR(Code::kInternal, "validate arena '" + name() + "'", -1,
                            "slab " + std::to_string(slab.id) + " has " +
                                std::to_string(slab.regions.size()) + " registrations for " +
                                std::to_string(registrars_.size()) + " registrars");
    }
  }
  if (reserved != bytes_reserved_) {
    return RDMAFLOW_ERROR(Code::kInternal, "validate arena '" + name() + "'", -1,
                          "slabs map " + std::to_string(reserved) + " B, counter says " +
                              std::to_string(bytes_reserved_));
  }
  return Status::ok();
}

}  // namespace rdmaflow
