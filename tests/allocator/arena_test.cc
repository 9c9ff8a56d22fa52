// RegisteredArena: randomized alloc/free checked against a reference model,
// multithreaded stress, limits and bad input (the registration hook and the
// environment knobs: arena_registration_test.cc).
//
// The registrar here is a recording double: it is the hook's client, not the
// thing under test. The arena's memory is real (mmap), and every allocation is
// filled with a pattern and checked before it is freed.
#include "allocator/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/allocator/arena_test_util.h"

namespace rdmaflow {
namespace {

using namespace arena_test;

// ---------------------------------------------------------------------------
// Randomized sequences against a reference model.

struct Live {
  size_t size;
  size_t capacity;
  uint8_t pattern;
};

size_t random_size(std::mt19937_64& rng, size_t slab) {
  const int r = static_cast<int>(rng() % 100);
  if (r < 4) return 0;
  if (r < 60) return 1 + rng() % (4 * kKiB);
  if (r < 90) return 4 * kKiB + rng() % (252 * kKiB);
  if (r < 99) return 256 * kKiB + rng() % (1280 * kKiB);
  return slab + 1 + rng() % slab;  // gets its own slab
}

size_t random_alignment(std::mt19937_64& rng) {
  static constexpr size_t kAligns[] = {0, 0, 0, 1, 8, 64, 256, 512, 4096, 65536};
  if (rng() % 100 == 0) return 2 * kMiB;
  return kAligns[rng() % std::size(kAligns)];
}

class ArenaRandomized : public ::testing::TestWithParam<std::tuple<uint64_t, size_t>> {};

TEST_P(ArenaRandomized, MatchesReferenceModel) {
  const auto [seed, retain] = GetParam();
  constexpr size_t kSlab = 4 * kMiB;
  constexpr int kOps = 4000;
  RecordingRegistrar reg("recorder");
  auto arena = make_arena(kSlab, 0, retain);
  ASSERT_TRUE(arena->attach(&reg).is_ok());

  std::mt19937_64 rng(seed);
  std::map<uintptr_t, Live> model;
  std::vector<uintptr_t> order;  // live addresses, for random picks
  size_t model_in_use = 0;
  size_t model_peak = 0;
  uint64_t made = 0;
  uint64_t serial = 0;

  auto check_stats = [&] {
    ArenaStats s = arena->stats();
    ASSERT_EQ(s.bytes_in_use, model_in_use);
    ASSERT_EQ(s.peak_bytes_in_use, model_peak);
    ASSERT_EQ(s.live_allocations, model.size());
    ASSERT_EQ(s.allocation_count, made);
    ASSERT_EQ(s.failed_allocations, 0u);
    ASSERT_LE(s.bytes_in_use, s.bytes_reserved);
    ASSERT_LE(s.largest_free_block, s.bytes_reserved - s.bytes_in_use);
    ASSERT_EQ(s.registrations - s.deregistrations, s.slab_count);
  };

  for (int op = 0; op < kOps; ++op) {
    const bool do_alloc =
        order.empty() || (order.size() < 200 ? rng() % 100 < 55 : rng() % 100 < 35);
    if (do_alloc) {
      const size_t size = random_size(rng, kSlab);
      const size_t align = random_alignment(rng);
      auto a = arena->allocate(size, align);
      ASSERT_TRUE(a.is_ok()) << a.status().to_string();
      const auto p = reinterpret_cast<uintptr_t>(a->ptr);
      ASSERT_NE(p, 0u);
      ASSERT_EQ(a->size, size);
      ASSERT_GE(a->capacity, std::max<size_t>(size, 1));
      ASSERT_EQ(a->capacity % 256, 0u);
      ASSERT_EQ(p % std::max<size_t>(align == 0 ? 256 : align, 256), 0u) << "align " << align;
      // No overlap with the neighbours in the model.
      auto next = model.lower_bound(p);
      if (next != model.end()) {
        ASSERT_LE(p + a->capacity, next->first);
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.capacity, p);
      }
      // Slab bookkeeping agrees.
      auto slab = arena->find_slab(a->ptr, a->capacity);
      ASSERT_TRUE(slab.is_ok()) << slab.status().to_string();
      ASSERT_EQ(slab->id, a->slab);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(slab->base) + a->offset, p);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(slab->base) % (2 * kMiB), 0u);
      if (size > kSlab) {
        ASSERT_GE(slab->length, size);
      }

      const uint8_t pat = pattern_for(++serial);
      std::memset(a->ptr, pat, a->capacity);
      model[p] = Live{size, a->capacity, pat};
      order.push_back(p);
      model_in_use += a->capacity;
      model_peak = std::max(model_peak, model_in_use);
      ++made;
    } else {
      const size_t idx = rng() % order.size();
      const uintptr_t p = order[idx];
      order[idx] = order.back();
      order.pop_back();
      const Live live = model.at(p);
      ASSERT_TRUE(holds_pattern(reinterpret_cast<void*>(p), live.capacity, live.pattern))
          << "allocation at " << p << " was clobbered";
      Status st = arena->free(reinterpret_cast<void*>(p));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      model.erase(p);
      model_in_use -= live.capacity;
    }
    ASSERT_NO_FATAL_FAILURE(check_stats());
    if (op % 97 == 0) {
      Status v = arena->validate();
      ASSERT_TRUE(v.is_ok()) << v.to_string();
    }
    if (op % 499 == 0) {
      ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, reg));
    }
  }

  // Every survivor still holds its pattern; then free everything.
  for (uintptr_t p : order) {
    const Live& live = model.at(p);
    ASSERT_TRUE(holds_pattern(reinterpret_cast<void*>(p), live.capacity, live.pattern));
    ASSERT_TRUE(arena->free(reinterpret_cast<void*>(p)).is_ok());
  }
  ASSERT_TRUE(arena->validate().is_ok()) << arena->validate().to_string();
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  // Full coalescing: one free block per slab, each as large as its slab.
  EXPECT_EQ(s.free_blocks, s.slab_count);
  size_t largest_slab = 0;
  for (const SlabInfo& info : arena->slabs()) largest_slab = std::max(largest_slab, info.length);
  EXPECT_EQ(s.largest_free_block, largest_slab);
  if (retain == kKeepAll) {
    EXPECT_EQ(s.slabs_released, 0u);
    EXPECT_EQ(s.slab_count, s.slabs_mapped);
  } else {
    EXPECT_EQ(s.slab_count, retain);
  }
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, reg));

  EXPECT_EQ(arena->release_free_slabs(), s.slab_count);
  s = arena->stats();
  EXPECT_EQ(s.slab_count, 0u);
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.registrations, s.deregistrations);
  EXPECT_TRUE(reg.live().empty());
  EXPECT_EQ(reg.bad_deregistrations(), 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ArenaRandomized,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u, 42u, 20240601u),
                                            ::testing::Values(size_t{1}, kKeepAll)));

// ---------------------------------------------------------------------------
// Threads.

TEST(Arena, MultithreadedStress) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 2500;
  RecordingRegistrar steady("steady");
  RecordingRegistrar flappy("flappy");  // attached and detached while others allocate
  auto arena = make_arena(2 * kMiB, 0, 1);
  ASSERT_TRUE(arena->attach(&steady).is_ok());

  std::atomic<bool> failed{false};
  std::atomic<int> workers_done{0};
  std::atomic<uint64_t> made{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<std::tuple<void*, size_t, uint8_t>> mine;
      uint64_t serial = static_cast<uint64_t>(t) << 32;
      for (int op = 0; op < kOpsPerThread && !failed; ++op) {
        if (mine.empty() || rng() % 100 < 52) {
          const size_t size = rng() % 10 == 0 ? 64 * kKiB + rng() % (512 * kKiB) : rng() % 8192;
          auto a = arena->allocate(size, rng() % 4 == 0 ? 4096 : 0);
          if (!a.is_ok()) {
            ADD_FAILURE() << a.status().to_string();
            failed = true;
            break;
          }
          const uint8_t pat = pattern_for(++serial);
          std::memset(a->ptr, pat, a->capacity);
          mine.emplace_back(a->ptr, a->capacity, pat);
          ++made;
        } else {
          const size_t idx = rng() % mine.size();
          auto [p, cap, pat] = mine[idx];
          mine[idx] = mine.back();
          mine.pop_back();
          if (!holds_pattern(p, cap, pat)) {
            ADD_FAILURE() << "thread " << t << ": allocation clobbered by another thread";
            failed = true;
          }
          if (Status st = arena->free(p); !st.is_ok()) {
            ADD_FAILURE() << st.to_string();
            failed = true;
          }
        }
      }
      for (auto& [p, cap, pat] : mine) {
        if (!holds_pattern(p, cap, pat)) failed = true;
        if (!arena->free(p).is_ok()) failed = true;
      }
      ++workers_done;
    });
  }
  // Meanwhile: attach/detach a second registrar and read stats/validate.
  int flaps = 0;
  // (No ASSERT while workers run: returning early would destroy joinable threads.)
  while (workers_done.load() < kThreads) {
    Status attached = arena->attach(&flappy);
    Status valid = arena->validate();
    (void)arena->stats().to_string();
    Status detached = arena->detach(&flappy);
    if (!attached.is_ok() || !valid.is_ok() || !detached.is_ok()) {
      ADD_FAILURE() << attached.to_string() << " / " << valid.to_string() << " / "
                    << detached.to_string();
      failed = true;
      (void)arena->detach(&flappy);
    }
    ++flaps;
  }
  for (auto& th : threads) th.join();
  ASSERT_FALSE(failed.load());

  ASSERT_TRUE(arena->validate().is_ok()) << arena->validate().to_string();
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.allocation_count, made.load());
  EXPECT_EQ(s.free_blocks, s.slab_count);
  EXPECT_EQ(s.slab_count, 1u);  // retain_empty_slabs = 1
  EXPECT_GT(flaps, 0);
  EXPECT_TRUE(flappy.live().empty());
  EXPECT_EQ(flappy.register_calls(), flappy.deregister_calls());
  EXPECT_EQ(flappy.bad_deregistrations(), 0);
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, steady));
  std::printf("stress: %llu allocations, %llu slabs mapped, %d attach/detach cycles; %s\n",
              static_cast<unsigned long long>(s.allocation_count),
              static_cast<unsigned long long>(s.slabs_mapped), flaps, s.to_string().c_str());
}

// ---------------------------------------------------------------------------
// The registration hook.

TEST(Arena, BadFreesAreRefusedAndChangeNothing) {
  auto arena = make_arena(2 * kMiB);
  auto a = arena->allocate(4096);
  auto b = arena->allocate(4096);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const ArenaStats before = arena->stats();

  int on_stack = 0;
  Status unknown = arena->free(&on_stack);
  EXPECT_EQ(unknown.code(), Code::kNotFound);
  EXPECT_NE(unknown.to_string().find("no slab of this arena"), std::string::npos)
      << unknown.to_string();

  Status interior = arena->free(static_cast<char*>(a->ptr) + 256);
  EXPECT_EQ(interior.code(), Code::kInvalidArgument);
  EXPECT_NE(interior.reason().find("256 B inside the allocation"), std::string::npos)
      << interior.to_string();

  auto slab = arena->find_slab(a->ptr);
  ASSERT_TRUE(slab.is_ok());
  void* free_space = static_cast<char*>(slab->base) + slab->length - 256;
  EXPECT_EQ(arena->free(free_space).code(), Code::kInvalidArgument);

  const ArenaStats mid = arena->stats();
  EXPECT_EQ(mid.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(mid.live_allocations, before.live_allocations);
  EXPECT_EQ(mid.free_blocks, before.free_blocks);

  ASSERT_TRUE(arena->free(a->ptr).is_ok());
  Status twice = arena->free(a->ptr);
  EXPECT_EQ(twice.code(), Code::kInvalidArgument);
  EXPECT_NE(twice.reason().find("double free"), std::string::npos) << twice.to_string();
  EXPECT_NE(twice.to_string().find("free 0x"), std::string::npos) << twice.to_string();
  EXPECT_TRUE(arena->free(nullptr).is_ok());
  EXPECT_EQ(arena->stats().live_allocations, 1u);
  EXPECT_TRUE(arena->validate().is_ok());
}

TEST(Arena, ZeroBytesGetDistinctRegisteredPointers) {
  auto arena = make_arena(2 * kMiB);
  auto a = arena->allocate(0);
  auto b = arena->allocate(0);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NE(a->ptr, nullptr);
  EXPECT_NE(a->ptr, b->ptr);
  EXPECT_EQ(a->size, 0u);
  EXPECT_EQ(a->capacity, 256u);
  EXPECT_TRUE(arena->contains(a->ptr, 0));
  EXPECT_EQ(arena->stats().bytes_in_use, 512u);
  EXPECT_TRUE(arena->free(*a).is_ok());
  EXPECT_TRUE(arena->free(*b).is_ok());
  EXPECT_EQ(arena->stats().bytes_in_use, 0u);
}

TEST(Arena, HonoursEveryAlignmentAndRefusesBadOnes) {
  auto arena = make_arena(4 * kMiB);
  std::vector<void*> ptrs;
  for (size_t align = 1; align <= 2 * kMiB; align <<= 1) {
    auto a = arena->allocate(1000, align);
    ASSERT_TRUE(a.is_ok()) << "align " << align << ": " << a.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->ptr) % align, 0u) << align;
    ptrs.push_back(a->ptr);
  }
  for (size_t bad : {size_t{3}, size_t{768}, 4 * kMiB}) {
    auto a = arena->allocate(64, bad);
    ASSERT_FALSE(a.is_ok());
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
    EXPECT_NE(a.status().reason().find("power of two"), std::string::npos);
  }
  for (void* p : ptrs) ASSERT_TRUE(arena->free(p).is_ok());

  ArenaOptions o;
  o.slab_bytes = 2 * kMiB;
  o.max_bytes = 0;
  o.default_alignment = 4096;
  auto custom = RegisteredArena::create(o);
  ASSERT_TRUE(custom.is_ok());
  for (int i = 0; i < 8; ++i) {
    auto a = (*custom)->allocate(300);
    ASSERT_TRUE(a.is_ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->ptr) % 4096, 0u);
  }
  o.default_alignment = 48;
  EXPECT_EQ(RegisteredArena::create(o).status().code(), Code::kInvalidArgument);
}

TEST(Arena, OversizedRequestGetsItsOwnSlab) {
  auto arena = make_arena(4 * kMiB);
  auto small = arena->allocate(4096);
  ASSERT_TRUE(small.is_ok());
  auto big = arena->allocate(9 * kMiB);
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_NE(big->slab, small->slab);
  EXPECT_EQ(big->offset, 0u);
  auto slab = arena->find_slab(big->ptr, big->size);
  ASSERT_TRUE(slab.is_ok());
  EXPECT_EQ(slab->length, 10 * kMiB);  // rounded up to 2 MiB, not to a multiple of the slab size
  EXPECT_EQ(reinterpret_cast<uintptr_t>(slab->base) % (2 * kMiB), 0u);
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.slab_count, 2u);
  EXPECT_EQ(s.bytes_reserved, 14 * kMiB);
  std::memset(big->ptr, 0x5a, big->size);  // all of it is usable memory
  EXPECT_TRUE(arena->free(big->ptr).is_ok());
  EXPECT_TRUE(arena->free(small->ptr).is_ok());
}

TEST(Arena, MaxBytesCapIsEnforcedWithAClearMessage) {
  auto arena = make_arena(4 * kMiB, 8 * kMiB);
  auto a = arena->allocate(3 * kMiB);
  auto b = arena->allocate(3 * kMiB);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto c = arena->allocate(3 * kMiB);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::kResourceExhausted);
  const std::string text = c.status().to_string();
  EXPECT_NE(text.find("RDMAFLOW_ARENA_MAX_MB"), std::string::npos) << text;
  EXPECT_NE(text.find("8 MiB cap"), std::string::npos) << text;
  EXPECT_NE(text.find("allocate 3145728 B from arena 'test'"), std::string::npos) << text;
  EXPECT_EQ(arena->allocate(20 * kMiB).status().code(), Code::kResourceExhausted);
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.bytes_reserved, 8 * kMiB);
  EXPECT_EQ(s.failed_allocations, 2u);
  // What still fits in existing slabs is served.
  EXPECT_TRUE(arena->allocate(512 * kKiB).is_ok());
  // Freeing makes room again.
  ASSERT_TRUE(arena->free(a->ptr).is_ok());
  EXPECT_TRUE(arena->allocate(3 * kMiB).is_ok());
}

TEST(Arena, LastSlabShrinksToFitTheCap) {
  auto arena = make_arena(4 * kMiB, 6 * kMiB);
  ASSERT_TRUE(arena->allocate(3 * kMiB).is_ok());
  auto b = arena->allocate(1536 * kKiB);  // a 4 MiB slab would pass the cap; a 2 MiB one fits
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(arena->find_slab(b->ptr)->length, 2 * kMiB);
  EXPECT_EQ(arena->stats().bytes_reserved, 6 * kMiB);
  EXPECT_EQ(arena->allocate(1536 * kKiB).status().code(), Code::kResourceExhausted);
}

TEST(Arena, FindSlabAndContains) {
  auto arena = make_arena(2 * kMiB);
  auto a = arena->allocate(1000);
  ASSERT_TRUE(a.is_ok());
  auto slab = arena->find_slab(a->ptr, a->capacity);
  ASSERT_TRUE(slab.is_ok());
  auto* base = static_cast<char*>(slab->base);
  EXPECT_TRUE(arena->contains(base, slab->length));
  EXPECT_TRUE(arena->contains(base + slab->length - 1, 1));
  EXPECT_FALSE(arena->contains(base + slab->length - 1, 2));
  EXPECT_FALSE(arena->contains(base + slab->length, 0));
  EXPECT_FALSE(arena->contains(base - 1, 1));
  int on_stack = 0;
  EXPECT_FALSE(arena->contains(&on_stack, sizeof(on_stack)));
  auto missing = arena->find_slab(base + slab->length - 8, 16);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  RecordingRegistrar none("none");
  EXPECT_EQ(arena->region_of(&none, a->ptr, 1).status().code(), Code::kNotFound);
}

TEST(Arena, SlabsAre2MiBAlignedInEveryHugePageMode) {
  for (HugePages mode : {HugePages::kOff, HugePages::kTransparent, HugePages::kAuto}) {
    auto arena = make_arena(2 * kMiB, 0, 1, mode);
    auto a = arena->allocate(kMiB);
    ASSERT_TRUE(a.is_ok());
    auto slab = arena->find_slab(a->ptr);
    ASSERT_TRUE(slab.is_ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slab->base) % (2 * kMiB), 0u);
    if (mode == HugePages::kOff) {
      EXPECT_EQ(slab->pages, PageKind::kNormal);
    }
    if (mode == HugePages::kTransparent) {
      EXPECT_NE(slab->pages, PageKind::kHugeTlb);
    }
    std::memset(a->ptr, 1, a->capacity);
    std::printf("huge pages mode %d -> %s\n", static_cast<int>(mode),
                std::string(page_kind_name(slab->pages)).c_str());
  }
  EXPECT_EQ(MappedSlab::map(12345, HugePages::kOff).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MappedSlab::map(0, HugePages::kOff).status().code(), Code::kInvalidArgument);
}

TEST(Arena, StatsToStringNamesEverything) {
  RecordingRegistrar a("A");
  auto arena = make_arena(2 * kMiB);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  auto p = arena->allocate(1536);
  ASSERT_TRUE(p.is_ok());
  const std::string text = arena->to_string();
  for (const char* word : {"arena 'test'", "in use 1.50 KiB", "1 live allocations",
                           "reserved 2 MiB", "1 slabs", "largest free block", "1 registrations"}) {
    EXPECT_NE(text.find(word), std::string::npos) << word << " missing from: " << text;
  }
}

#if defined(__SANITIZE_ADDRESS__)
// Free arena memory is poisoned, so a use after free is reported even though
// the slab stays mapped.
TEST(ArenaAsan, UseAfterFreeIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto arena = make_arena(2 * kMiB);
  auto a = arena->allocate(4096);
  ASSERT_TRUE(a.is_ok());
  auto* p = static_cast<volatile char*>(a->ptr);
  p[0] = 1;  // fine while allocated
  ASSERT_TRUE(arena->free(a->ptr).is_ok());
  EXPECT_DEATH(p[10] = 2, "use-after-poison");
}
#endif

}  // namespace
}  // namespace rdmaflow
