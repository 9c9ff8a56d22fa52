// BfcPool is pure bookkeeping (it never touches the memory it manages), so
// these tests drive it with made-up addresses.
#include "allocator/bfc.h"

#include <gtest/gtest.h>

namespace rdmaflow {
namespace {

constexpr uintptr_t kBase = 0x10000000;

TEST(BfcPool, SplitsBestFitAndCoalescesBothSides) {
  BfcPool pool;
  pool.add_slab(7, kBase, 4096);
  auto a = pool.allocate(1024, 256);
  auto b = pool.allocate(1024, 256);
  auto c = pool.allocate(1024, 256);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->addr, kBase);
  EXPECT_EQ(b->addr, kBase + 1024);
  EXPECT_EQ(c->addr, kBase + 2048);
  EXPECT_EQ(a->slab, 7u);
  EXPECT_EQ(pool.bytes_in_use(), 3072u);
  EXPECT_EQ(pool.free_block_count(), 1u);

  // Free the middle block: a hole of 1024 between two used blocks.
  ASSERT_TRUE(pool.free(b->addr));
  EXPECT_EQ(pool.free_block_count(), 2u);
  // Best fit: a 512 B request takes the 1024 B hole, not the 1024 B tail at a higher address...
  // both are 1024, so the lower address wins.
  auto d = pool.allocate(512, 256);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->addr, kBase + 1024);
  ASSERT_TRUE(pool.free(d->addr));

  // Freeing a and c merges everything back into one block.
  ASSERT_TRUE(pool.free(a->addr));
  ASSERT_TRUE(pool.free(c->addr));
  EXPECT_EQ(pool.free_block_count(), 1u);
  EXPECT_EQ(pool.largest_free_block(), 4096u);
  EXPECT_TRUE(pool.slab_is_free(kBase));
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
}

TEST(BfcPool, PrefersTheSmallestBlockThatFits) {
  BfcPool pool;
  pool.add_slab(0, kBase, 16 * 1024);
  // Carve holes of 4 KiB (low address) and 1 KiB (high address).
  auto big_hole = pool.allocate(4096, 256);
  auto sep1 = pool.allocate(256, 256);
  auto small_hole = pool.allocate(1024, 256);
  auto sep2 = pool.allocate(256, 256);
  ASSERT_TRUE(big_hole && sep1 && small_hole && sep2);
  ASSERT_TRUE(pool.free(big_hole->addr));
  ASSERT_TRUE(pool.free(small_hole->addr));
  auto x = pool.allocate(768, 256);
  ASSERT_TRUE(x);
  EXPECT_EQ(x->addr, small_hole->addr);
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
}

TEST(BfcPool, AlignmentLeavesAFreeHead) {
  BfcPool pool;
  pool.add_slab(0, kBase, 64 * 1024);
  auto a = pool.allocate(256, 256);
  ASSERT_TRUE(a);
  auto b = pool.allocate(256, 8192);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->addr % 8192, 0u);
  EXPECT_EQ(b->addr, kBase + 8192);
  // [kBase+256, kBase+8192) is a free head, and the tail after b is free.
  EXPECT_EQ(pool.free_block_count(), 2u);
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
  ASSERT_TRUE(pool.free(b->addr));
  ASSERT_TRUE(pool.free(a->addr));
  EXPECT_EQ(pool.free_block_count(), 1u);
}

TEST(BfcPool, NeverMergesAcrossAdjacentSlabs) {
  BfcPool pool;
  pool.add_slab(0, kBase, 4096);
  pool.add_slab(1, kBase + 4096, 4096);  // contiguous in address space, still two slabs
  auto a = pool.allocate(4096, 256);
  auto b = pool.allocate(4096, 256);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->slab, b->slab);
  EXPECT_FALSE(pool.allocate(256, 256));
  ASSERT_TRUE(pool.free(a->addr));
  ASSERT_TRUE(pool.free(b->addr));
  EXPECT_EQ(pool.free_block_count(), 2u);
  EXPECT_EQ(pool.largest_free_block(), 4096u);
  EXPECT_FALSE(pool.fits(8192, 256));
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
  EXPECT_TRUE(pool.remove_slab(kBase));
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
}

TEST(BfcPool, RefusesUnknownAndDoubleFrees) {
  BfcPool pool;
  pool.add_slab(0, kBase, 4096);
  auto a = pool.allocate(512, 256);
  ASSERT_TRUE(a);
  EXPECT_FALSE(pool.free(a->addr + 256));  // interior
  EXPECT_FALSE(pool.free(kBase + 4096));   // outside
  EXPECT_FALSE(pool.remove_slab(kBase));   // not entirely free
  ASSERT_TRUE(pool.free(a->addr));
  EXPECT_FALSE(pool.free(a->addr));  // double
  auto blk = pool.block_containing(a->addr);
  ASSERT_TRUE(blk);
  EXPECT_TRUE(blk->free);
  EXPECT_TRUE(pool.validate().is_ok()) << pool.validate().to_string();
}

}  // namespace
}  // namespace rdmaflow
