// What the arena tests share: a recording registrar (the hook's client, not
// the thing under test), arena construction and the pattern checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/arena.h"

namespace rdmaflow::arena_test {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kKeepAll = std::numeric_limits<size_t>::max();

// Records every call; can be told to fail the Nth registration.
class RecordingRegistrar : public MemoryRegistrar {
 public:
  explicit RecordingRegistrar(std::string name) : name_(std::move(name)) {}

  std::string registrar_name() const override { return name_; }

  Result<RegionId> register_memory(void* addr, size_t len) override {
    std::lock_guard lock(mu_);
    ++register_calls_;
    if (fail_next_ > 0 && --fail_next_ == 0) {
      return RDMAFLOW_ERROR(Code::kResourceExhausted, "ibv_reg_mr", -1, "fake: out of MR slots");
    }
    RegionId id = next_id_++;
    live_[id] = {reinterpret_cast<uintptr_t>(addr), len};
    return id;
  }

  Status deregister_memory(RegionId region) override {
    std::lock_guard lock(mu_);
    ++deregister_calls_;
    if (live_.erase(region) == 0) {
      ++bad_deregistrations_;
      return RDMAFLOW_ERROR(Code::kNotFound, "ibv_dereg_mr", -1, "fake: unknown region");
    }
    return Status::ok();
  }

  // The nth later register_memory call fails (1 = the next one).
  void fail_nth_registration(int n) {
    std::lock_guard lock(mu_);
    fail_next_ = n;
  }

  std::map<RegionId, std::pair<uintptr_t, size_t>> live() const {
    std::lock_guard lock(mu_);
    return live_;
  }
  int register_calls() const {
    std::lock_guard lock(mu_);
    return register_calls_;
  }
  int deregister_calls() const {
    std::lock_guard lock(mu_);
    return deregister_calls_;
  }
  int bad_deregistrations() const {
    std::lock_guard lock(mu_);
    return bad_deregistrations_;
  }

 private:
  std::string name_;
  mutable std::mutex mu_;
  std::map<RegionId, std::pair<uintptr_t, size_t>> live_;
  RegionId next_id_ = 100;
  int fail_next_ = 0;
  int register_calls_ = 0;
  int deregister_calls_ = 0;
  int bad_deregistrations_ = 0;
};

inline std::unique_ptr<RegisteredArena> make_arena(size_t slab, size_t max = 0, size_t retain = 1,
                                                   HugePages huge = HugePages::kAuto) {
  ArenaOptions o;
  o.name = "test";
  o.slab_bytes = slab;
  o.max_bytes = max;
  o.retain_empty_slabs = retain;
  o.huge_pages = huge;
  auto arena = RegisteredArena::create(o);
  EXPECT_TRUE(arena.is_ok()) << arena.status().to_string();
  return std::move(arena).value();
}

// Every live slab is registered exactly once with `r`, under the region id the
// arena reports, and `r` holds nothing else.
inline void expect_registered_once(const RegisteredArena& arena, const RecordingRegistrar& r) {
  auto live = r.live();
  auto slabs = arena.slabs();
  ASSERT_EQ(live.size(), slabs.size()) << r.registrar_name();
  for (const SlabInfo& s : slabs) {
    auto id = s.region_for(&r);
    ASSERT_TRUE(id.has_value()) << "slab " << s.id << " not registered with " << r.registrar_name();
    auto it = live.find(*id);
    ASSERT_NE(it, live.end());
    EXPECT_EQ(it->second.first, reinterpret_cast<uintptr_t>(s.base));
    EXPECT_EQ(it->second.second, s.length);
    int with_same_range = 0;
    for (const auto& [rid, range] : live) {
      with_same_range += range == std::make_pair(reinterpret_cast<uintptr_t>(s.base), s.length);
    }
    EXPECT_EQ(with_same_range, 1);
  }
}

inline uint8_t pattern_for(uint64_t serial) {
  return static_cast<uint8_t>(serial * 131 + 17);
}

// memcmp against a reference chunk: fast, also under ASan (one range check per call).
inline bool holds_pattern(const void* p, size_t n, uint8_t pat) {
  constexpr size_t kChunk = 64 * 1024;
  std::vector<uint8_t> ref(std::min(n, kChunk), pat);
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(kChunk, n - done);
    if (std::memcmp(b + done, ref.data(), len) != 0) return false;
    done += len;
  }
  return true;
}

}  // namespace rdmaflow::arena_test
