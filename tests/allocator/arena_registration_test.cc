// RegisteredArena's registration hook (each slab once per registrar, failures
// undone, release and reserve) and its environment knobs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "allocator/arena.h"
#include "tests/allocator/arena_test_util.h"

namespace rdmaflow {
namespace {

using namespace arena_test;

TEST(ArenaRegistration, EachSlabOncePerRegistrarUntilDetachOrDestruction) {
  RecordingRegistrar a("A");
  RecordingRegistrar b("B");
  std::vector<void*> ptrs;
  {
    auto arena = make_arena(2 * kMiB, 0, kKeepAll);
    for (int i = 0; i < 3; ++i) {  // one 1.5 MiB allocation per 2 MiB slab
      auto p = arena->allocate(1536 * kKiB);
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      ptrs.push_back(p->ptr);
    }
    ASSERT_EQ(arena->stats().slab_count, 3u);

    ASSERT_TRUE(arena->attach(&a).is_ok());  // registers the three existing slabs
    EXPECT_EQ(a.register_calls(), 3);
    ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, a));

    auto p = arena->allocate(1536 * kKiB);  // a fourth slab, registered once with A
    ASSERT_TRUE(p.is_ok());
    ptrs.push_back(p->ptr);
    EXPECT_EQ(a.register_calls(), 4);

    ASSERT_TRUE(arena->attach(&b).is_ok());
    EXPECT_EQ(b.register_calls(), 4);
    ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, a));
    ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, b));
    EXPECT_EQ(arena->stats().registrations, 8u);
    EXPECT_EQ(arena->stats().registrars, 2u);

    // region_of / find_slab agree with what the registrar handed out.
    auto slab = arena->find_slab(p->ptr, p->size);
    ASSERT_TRUE(slab.is_ok());
    auto ra = arena->region_of(&a, p->ptr, p->size);
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    EXPECT_EQ(*ra, *slab->region_for(&a));
    EXPECT_EQ(a.live().at(*ra).first, reinterpret_cast<uintptr_t>(slab->base));

    // Allocations that fit existing slabs register nothing.
    ASSERT_TRUE(arena->free(ptrs.back()).is_ok());
    ptrs.pop_back();
    auto q = arena->allocate(kMiB);
    ASSERT_TRUE(q.is_ok());
    ptrs.push_back(q->ptr);
    EXPECT_EQ(a.register_calls(), 4);

    ASSERT_TRUE(arena->detach(&a).is_ok());
    EXPECT_TRUE(a.live().empty());
    EXPECT_EQ(a.deregister_calls(), 4);
    EXPECT_FALSE(arena->region_of(&a, q->ptr, 1).is_ok());

    auto r = arena->allocate(1536 * kKiB);  // new slab: B only
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(a.register_calls(), 4);
    EXPECT_EQ(b.register_calls(), 5);
    ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, b));
    EXPECT_TRUE(arena->validate().is_ok());
    // The arena is destroyed with live allocations: it still deregisters everything.
  }
  EXPECT_TRUE(b.live().empty());
  EXPECT_EQ(b.deregister_calls(), 5);
  EXPECT_EQ(a.bad_deregistrations() + b.bad_deregistrations(), 0);
}

TEST(ArenaRegistration, RefusesDoubleAttachUnknownDetachAndNull) {
  RecordingRegistrar a("A");
  auto arena = make_arena(2 * kMiB);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  Status twice = arena->attach(&a);
  EXPECT_EQ(twice.code(), Code::kInvalidArgument);
  EXPECT_NE(twice.to_string().find("already attached"), std::string::npos) << twice.to_string();
  EXPECT_EQ(arena->attach(nullptr).code(), Code::kInvalidArgument);
  RecordingRegistrar stranger("stranger");
  EXPECT_EQ(arena->detach(&stranger).code(), Code::kNotFound);
  EXPECT_EQ(arena->detach(nullptr).code(), Code::kNotFound);
  ASSERT_TRUE(arena->detach(&a).is_ok());
  EXPECT_EQ(arena->detach(&a).code(), Code::kNotFound);
}

TEST(ArenaRegistration, FailureFailsTheAllocationAndLeaksNothing) {
  RecordingRegistrar a("A");
  RecordingRegistrar b("B");
  auto arena = make_arena(2 * kMiB);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  ASSERT_TRUE(arena->attach(&b).is_ok());
  auto first = arena->allocate(kMiB);
  ASSERT_TRUE(first.is_ok());
  const ArenaStats before = arena->stats();

  b.fail_nth_registration(1);
  auto big = arena->allocate(3 * kMiB);  // needs a new slab; B refuses it
  ASSERT_FALSE(big.is_ok());
  const Status& st = big.status();
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_EQ(st.reason(), "fake: out of MR slots");
  EXPECT_NE(st.op().find("'B'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.op().find("ibv_reg_mr"), std::string::npos) << st.to_string();

  // A's registration of the doomed slab was undone; the slab is gone.
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, a));
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, b));
  const ArenaStats after = arena->stats();
  EXPECT_EQ(after.slab_count, before.slab_count);
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.failed_allocations, before.failed_allocations + 1);
  EXPECT_TRUE(arena->validate().is_ok());

  // Once B recovers, the same request succeeds.
  auto again = arena->allocate(3 * kMiB);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, a));
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, b));
  EXPECT_EQ(a.bad_deregistrations() + b.bad_deregistrations(), 0);
}

TEST(ArenaRegistration, FailedAttachIsUndone) {
  auto arena = make_arena(2 * kMiB, 0, kKeepAll);
  std::vector<void*> keep;
  for (int i = 0; i < 3; ++i) {
    auto p = arena->allocate(1536 * kKiB);
    ASSERT_TRUE(p.is_ok());
    keep.push_back(p->ptr);
  }
  RecordingRegistrar b("B");
  b.fail_nth_registration(2);
  Status st = arena->attach(&b);
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.op().find("attach registrar 'B'"), std::string::npos) << st.to_string();
  EXPECT_TRUE(b.live().empty());  // the first slab's registration was undone
  EXPECT_EQ(arena->stats().registrars, 0u);
  // Not attached: a new slab does not reach it, and detach says so.
  ASSERT_TRUE(arena->allocate(1536 * kKiB).is_ok());
  EXPECT_EQ(b.register_calls(), 2);
  EXPECT_EQ(arena->detach(&b).code(), Code::kNotFound);
  EXPECT_TRUE(arena->validate().is_ok());
}

TEST(ArenaRegistration, ReleasedSlabsAreDeregistered) {
  RecordingRegistrar a("A");
  auto arena = make_arena(2 * kMiB, 0, /*retain=*/0);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  auto p = arena->allocate(100);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(a.live().size(), 1u);
  ASSERT_TRUE(arena->free(p->ptr).is_ok());
  EXPECT_TRUE(a.live().empty());
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.slab_count, 0u);
  EXPECT_EQ(s.slabs_released, 1u);
  EXPECT_EQ(s.bytes_reserved, 0u);
  // The released slab's memory is no longer the arena's.
  EXPECT_FALSE(arena->contains(p->ptr, 1));
  EXPECT_EQ(arena->free(p->ptr).code(), Code::kNotFound);
}

TEST(ArenaRegistration, DefaultPolicyKeepsOneEmptySlab) {
  RecordingRegistrar a("A");
  auto arena = make_arena(2 * kMiB);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  std::vector<void*> ptrs;
  for (int i = 0; i < 3; ++i) {
    auto p = arena->allocate(1536 * kKiB);
    ASSERT_TRUE(p.is_ok());
    ptrs.push_back(p->ptr);
  }
  for (void* p : ptrs) ASSERT_TRUE(arena->free(p).is_ok());
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.slab_count, 1u);
  EXPECT_EQ(s.slabs_released, 2u);
  ASSERT_NO_FATAL_FAILURE(expect_registered_once(*arena, a));
  // The kept slab serves the next request without registering anything.
  ASSERT_TRUE(arena->allocate(1536 * kKiB).is_ok());
  EXPECT_EQ(a.register_calls(), 3);
}

TEST(ArenaRegistration, ReserveMapsAndRegistersAhead) {
  RecordingRegistrar a("A");
  auto arena = make_arena(4 * kMiB);
  ASSERT_TRUE(arena->attach(&a).is_ok());
  ASSERT_TRUE(arena->reserve(3 * kMiB).is_ok());
  EXPECT_EQ(arena->stats().slab_count, 1u);
  EXPECT_EQ(a.register_calls(), 1);
  ASSERT_TRUE(arena->reserve(kMiB).is_ok());  // already fits
  EXPECT_EQ(arena->stats().slab_count, 1u);
  auto p = arena->allocate(3 * kMiB);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(a.register_calls(), 1);
  EXPECT_EQ(arena->stats().slab_count, 1u);
}

// ---------------------------------------------------------------------------
// Sizes, alignment, limits, bad input.

// ---------------------------------------------------------------------------
// Environment knobs.

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(ArenaEnv, KnobsSetDefaultsAndOptionsWin) {
  ScopedEnv slab("RDMAFLOW_ARENA_SLAB_MB", "6");
  ScopedEnv max("RDMAFLOW_ARENA_MAX_MB", "12");
  auto arena = RegisteredArena::create();
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  EXPECT_EQ((*arena)->slab_bytes(), 6 * kMiB);
  EXPECT_EQ((*arena)->max_bytes(), 12 * kMiB);
  ASSERT_TRUE((*arena)->allocate(5 * kMiB).is_ok());
  ASSERT_TRUE((*arena)->allocate(5 * kMiB).is_ok());
  EXPECT_EQ((*arena)->allocate(5 * kMiB).status().code(), Code::kResourceExhausted);

  ArenaOptions o;
  o.slab_bytes = 3 * kMiB;  // rounded up to 4 MiB
  o.max_bytes = 0;          // explicit "no cap" beats the environment
  auto explicit_arena = RegisteredArena::create(o);
  ASSERT_TRUE(explicit_arena.is_ok());
  EXPECT_EQ((*explicit_arena)->slab_bytes(), 4 * kMiB);
  EXPECT_EQ((*explicit_arena)->max_bytes(), 0u);
}

TEST(ArenaEnv, DefaultSlabIs64MiB) {
  ScopedEnv slab("RDMAFLOW_ARENA_SLAB_MB", "");
  ScopedEnv max("RDMAFLOW_ARENA_MAX_MB", "");
  auto arena = RegisteredArena::create();
  ASSERT_TRUE(arena.is_ok());
  EXPECT_EQ((*arena)->slab_bytes(), 64 * kMiB);
  EXPECT_EQ((*arena)->max_bytes(), 0u);
}

TEST(ArenaEnv, MalformedKnobsAreRefusedByName) {
  {
    ScopedEnv slab("RDMAFLOW_ARENA_SLAB_MB", "lots");
    auto arena = RegisteredArena::create();
    ASSERT_FALSE(arena.is_ok());
    EXPECT_EQ(arena.status().code(), Code::kInvalidArgument);
    EXPECT_NE(arena.status().reason().find("RDMAFLOW_ARENA_SLAB_MB"), std::string::npos);
    EXPECT_NE(arena.status().op().find("create arena"), std::string::npos);
  }
  {
    ScopedEnv slab("RDMAFLOW_ARENA_SLAB_MB", "0");
    EXPECT_EQ(RegisteredArena::create().status().code(), Code::kInvalidArgument);
  }
  {
    ScopedEnv max("RDMAFLOW_ARENA_MAX_MB", "-5");
    auto arena = RegisteredArena::create();
    ASSERT_FALSE(arena.is_ok());
    EXPECT_NE(arena.status().reason().find("RDMAFLOW_ARENA_MAX_MB"), std::string::npos);
  }
}

}  // namespace
}  // namespace rdmaflow
