// The Session's decoders of peer input (session_dynamic.h, session_layout.h) and
// RemoteKey's size limit: regressions found while writing their fuzz target
// (fuzz/fuzz_session_records.cc, docs/fuzzing.md) and the round trips it relies on.
#include <gtest/gtest.h>

#include "runtime/session/session_dynamic.h"
#include "runtime/session/session_layout.h"
#include "tests/support/text.h"

namespace rdmaflow::session_detail {
namespace {

using testing::contains;

RemoteKey key(uint64_t id, uint64_t length) {
  return RemoteKey{.backend = "tcp", .key_id = id, .secret = {99}, .addr = 4096, .length = length};
}

// 2^31 x 2^31 f32 elements are 2^64 bytes: the product wrapped to 0 and a header
// claiming 0 bytes for them was accepted.
TEST(SessionCodec, DynamicHeaderWhoseByteCountWrapsIsRefused) {
  DynamicHeader h{.dtype = DataType::kF32, .step = 1, .bytes = 0, .dims = {1ll << 31, 1ll << 31}};
  std::vector<uint8_t> meta(128);
  ASSERT_TRUE(encode_dynamic_header(h, meta).is_ok());
  auto d = decode_dynamic_header(meta);
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), Code::kProtocolError);
  EXPECT_TRUE(contains(d.status().reason(), "does not match its shape")) << d.status().reason();
  h.dims = {1ll << 30, 4};  // 2^32 elements, 2^34 bytes: fine
  h.bytes = 1ull << 34;
  ASSERT_TRUE(encode_dynamic_header(h, meta).is_ok());
  auto ok = decode_dynamic_header(meta);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->bytes, 1ull << 34);
}

TEST(SessionCodec, SetupRecordRoundTripsAndRefusesBadFrames) {
  SetupRecord rec;
  rec.slots = {{3, 0, key(1, 64)}, {3, 1, key(2, 64)}};
  rec.credits = {{1, key(3, 8)}};
  auto bytes = encode_setup_record(rec);
  auto back = decode_setup_record(bytes, 2);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->slots.size(), 2u);
  EXPECT_EQ(back->slots[1].frame, 1u);
  EXPECT_EQ(back->slots[1].key.key_id, 2u);
  ASSERT_EQ(back->credits.size(), 1u);
  EXPECT_EQ(back->credits[0].key.key_id, 3u);
  EXPECT_EQ(encode_setup_record(*back), bytes);
  // Frame 1 of a single-copy plan, a truncated record, trailing bytes: refused.
  EXPECT_EQ(decode_setup_record(bytes, 1).status().code(), Code::kProtocolError);
  bytes.push_back(0);
  EXPECT_EQ(decode_setup_record(bytes, 2).status().code(), Code::kProtocolError);
  bytes.resize(bytes.size() - 10);
  EXPECT_EQ(decode_setup_record(bytes, 2).status().code(), Code::kProtocolError);
}

TEST(SessionCodec, RemoteKeyOverTheSizeLimitIsRefusedBeforeParsing) {
  RemoteKey k = key(7, 64);
  k.blob.assign(max_key_bytes(), 0xab);  // with its header, over the limit
  auto d = RemoteKey::deserialize(k.serialize());
  ASSERT_FALSE(d.is_ok());
  EXPECT_TRUE(contains(d.status().reason(), "RDMAFLOW_MAX_KEY_BYTES")) << d.status().reason();
  k.blob.resize(100);
  EXPECT_TRUE(RemoteKey::deserialize(k.serialize()).is_ok());
}

}  // namespace
}  // namespace rdmaflow::session_detail
