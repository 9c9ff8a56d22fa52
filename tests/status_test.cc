#include <gtest/gtest.h>

#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow {
namespace {

TEST(Status, NamesOperationPeerAndWhere) {
  Status s = RDMAFLOW_ERROR(Code::kTimeout, "write", 3, "no completion after 10 ms");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.peer(), 3);
  std::string text = s.to_string();
  EXPECT_NE(text.find("write (peer rank 3) failed: timeout: no completion after 10 ms"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("[tests/status_test.cc:"), std::string::npos) << text;
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = 5;
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 5);
  Result<int> bad = RDMAFLOW_ERROR(Code::kNotFound, "lookup", -1, "missing");
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kNotFound);
}

TEST(RemoteKey, RoundTripsAndRejectsGarbage) {
  RemoteKey k{"tcp", 7, KeySecret{0xdeadbeef, 0x0123456789abcdefull}, 0x1000, 4096, {1, 2, 3}};
  auto bytes = k.serialize();
  auto back = RemoteKey::deserialize(bytes);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->backend, "tcp");
  EXPECT_EQ(back->key_id, 7u);
  EXPECT_EQ(back->secret, (KeySecret{0xdeadbeef, 0x0123456789abcdefull}));
  EXPECT_EQ(back->length, 4096u);
  EXPECT_EQ(back->blob, (std::vector<uint8_t>{1, 2, 3}));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto r = RemoteKey::deserialize(std::span<const uint8_t>(bytes.data(), cut));
    EXPECT_FALSE(r.is_ok()) << "truncated at " << cut;
  }
  EXPECT_TRUE(k.covers(0, 4096));
  EXPECT_TRUE(k.covers(4096, 0));
  EXPECT_FALSE(k.covers(1, 4096));
  EXPECT_FALSE(k.covers(UINT64_MAX, 2));
}

}  // namespace
}  // namespace rdmaflow
