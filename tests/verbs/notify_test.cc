#include <gtest/gtest.h>

#include <limits>

#include "transport/verbs/notify.h"

namespace rdmaflow::verbs {
namespace {

TEST(Notify, SmallValuesTravelInline) {
  NotifyEncoder enc(8);
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, kMaxInlineNotify}) {
    auto e = enc.encode(v);
    ASSERT_TRUE(e.is_ok());
    EXPECT_FALSE(e->ring_slot.has_value()) << v;
    EXPECT_EQ(e->imm, static_cast<uint32_t>(v));
    auto d = decode_imm(e->imm, 8, 1);
    ASSERT_TRUE(d.is_ok());
    EXPECT_FALSE(d->ring_slot.has_value());
    EXPECT_EQ(d->value, v);
  }
  EXPECT_EQ(enc.next_slot(), 0u);  // inline values use no slot
}

TEST(Notify, LargeValuesGoThroughRingSlotsInOrder) {
  NotifyEncoder enc(4);
  std::vector<uint64_t> values = {kMaxInlineNotify + 1, std::numeric_limits<uint64_t>::max(),
                                  uint64_t{1} << 32,    uint64_t{7} << 40,
                                  uint64_t{1} << 63,    uint64_t{3} << 31};
  for (size_t i = 0; i < values.size(); ++i) {
    auto e = enc.encode(values[i]);
    ASSERT_TRUE(e.is_ok());
    ASSERT_TRUE(e->ring_slot.has_value());
    EXPECT_EQ(*e->ring_slot, i % 4);  // wraps around the ring
    EXPECT_TRUE(e->imm & kImmRingFlag);
    auto d = decode_imm(e->imm, 4, 1);
    ASSERT_TRUE(d.is_ok());
    ASSERT_TRUE(d->ring_slot.has_value());
    EXPECT_EQ(*d->ring_slot, i % 4);
  }
}

TEST(Notify, MixedInlineAndRingKeepSlotSequence) {
  NotifyEncoder enc(3);
  EXPECT_EQ(*enc.encode(uint64_t{1} << 40)->ring_slot, 0u);
  EXPECT_FALSE(enc.encode(5)->ring_slot.has_value());
  EXPECT_EQ(*enc.encode(uint64_t{1} << 40)->ring_slot, 1u);
  EXPECT_EQ(*enc.encode(uint64_t{1} << 40)->ring_slot, 2u);
  EXPECT_EQ(*enc.encode(uint64_t{1} << 40)->ring_slot, 0u);
}

TEST(Notify, SlotOutsideRingIsAProtocolError) {
  auto d = decode_imm(kImmRingFlag | 8, 8, 5);
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), Code::kProtocolError);
  EXPECT_EQ(d.status().peer(), 5);
  EXPECT_NE(d.status().reason().find("slot 8"), std::string::npos);
  EXPECT_TRUE(decode_imm(kImmRingFlag | 7, 8, 5).is_ok());
  EXPECT_FALSE(decode_imm(0xffffffffu, 8, 5).is_ok());
}

TEST(Notify, NoRingRefusesLargeValuesOnly) {
  NotifyEncoder enc(0);
  EXPECT_TRUE(enc.encode(kMaxInlineNotify).is_ok());
  auto e = enc.encode(kMaxInlineNotify + 1);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace rdmaflow::verbs
