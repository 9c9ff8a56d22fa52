#include <gtest/gtest.h>

#include "transport/verbs/verbs_wire.h"

namespace rdmaflow::verbs {
namespace {

Hello sample() {
  Hello h;
  h.rank = 3;
  h.credits = 64;
  h.msg_size = 8192;
  h.ring_slots = 64;
  h.ring_rkey = 0xabcdef01;
  h.ring_addr = 0x7f0012345000;
  return h;
}

TEST(Hello, RoundTripsAndFitsConnectPrivateData) {
  auto bytes = sample().encode();
  EXPECT_EQ(bytes.size(), kHelloSize);
  EXPECT_LE(bytes.size(), kMaxConnectPrivateData);
  auto h = Hello::decode(bytes);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->rank, 3);
  EXPECT_EQ(h->credits, 64u);
  EXPECT_EQ(h->msg_size, 8192u);
  EXPECT_EQ(h->ring_slots, 64u);
  EXPECT_EQ(h->ring_rkey, 0xabcdef01u);
  EXPECT_EQ(h->ring_addr, 0x7f0012345000u);
}

TEST(Hello, AcceptsCmZeroPadding) {
  auto bytes = sample().encode();
  bytes.resize(56, 0);  // IB CM REQ private data as delivered to the listener
  EXPECT_TRUE(Hello::decode(bytes).is_ok());
  bytes.resize(196, 0);  // REP
  EXPECT_TRUE(Hello::decode(bytes).is_ok());
}

TEST(Hello, RefusesTruncatedAndForeignData) {
  auto bytes = sample().encode();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto h = Hello::decode(std::span<const uint8_t>(bytes.data(), cut));
    ASSERT_FALSE(h.is_ok()) << cut;
    EXPECT_EQ(h.status().code(), Code::kProtocolError);
  }
  auto bad = bytes;
  bad[0] ^= 1;
  EXPECT_NE(Hello::decode(bad).status().reason().find("bad magic"), std::string::npos);
  bad = bytes;
  bad[4] = 9;
  EXPECT_NE(Hello::decode(bad).status().reason().find("version 9"), std::string::npos);
}

TEST(Hello, RefusesValuesTheChannelCannotWorkWith) {
  auto check = [](Hello h, const char* why) {
    auto r = Hello::decode(h.encode());
    ASSERT_FALSE(r.is_ok()) << why;
    EXPECT_NE(r.status().reason().find(why), std::string::npos) << r.status().reason();
  };
  Hello h = sample();
  h.rank = -1;
  check(h, "negative rank");
  h = sample();
  h.credits = 3;
  check(h, "minimum 4");
  h = sample();
  h.msg_size = 16;
  check(h, "receive buffer size 16");
  h = sample();
  h.msg_size = kMaxMsgSize + 1;
  check(h, "receive buffer size");
  h = sample();
  h.ring_slots = 63;  // fewer slots than credits breaks slot reuse safety
  check(h, "smaller than the credit window");
  h = sample();
  h.ring_addr = 0;
  check(h, "ring address is null");
}

TEST(MsgHeader, RoundTrips) {
  uint8_t buf[kMsgHeaderSize];
  for (bool last : {true, false}) {
    MsgHeader h;
    h.type = MsgType::kData;
    h.last = last;
    h.credits = 0x01020304;
    h.encode(buf);
    auto d = MsgHeader::decode(std::span<const uint8_t>(buf, sizeof(buf)), 2);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ(d->type, MsgType::kData);
    EXPECT_EQ(d->last, last);
    EXPECT_EQ(d->credits, 0x01020304u);
  }
  MsgHeader c;
  c.type = MsgType::kCredit;
  c.credits = 32;
  c.encode(buf);
  auto d = MsgHeader::decode(std::span<const uint8_t>(buf, sizeof(buf)), 2);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->type, MsgType::kCredit);
}

TEST(MsgHeader, RefusesMalformed) {
  uint8_t buf[kMsgHeaderSize + 4] = {};
  MsgHeader h;
  h.encode(buf);
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, 7), 1).is_ok());
  buf[0] = 9;
  auto r = MsgHeader::decode(std::span<const uint8_t>(buf, 8), 1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kProtocolError);
  EXPECT_EQ(r.status().peer(), 1);
  h.encode(buf);
  buf[1] |= 0x80;
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, 8), 1).is_ok());
  h.encode(buf);
  buf[3] = 1;
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, 8), 1).is_ok());
  MsgHeader c;
  c.type = MsgType::kCredit;
  c.encode(buf);
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, 12), 1).is_ok())
      << "credit messages carry no payload";
  c.last = false;
  c.encode(buf);
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, 8), 1).is_ok());
}

TEST(MsgHeader, ControlTypesAreSingleFragment) {
  uint8_t buf[kMsgHeaderSize];
  for (MsgType t :
       {MsgType::kKeyCheck, MsgType::kKeyVerdict, MsgType::kKeyRevoked, MsgType::kAuth}) {
    MsgHeader h;
    h.type = t;
    h.encode(buf);
    auto d = MsgHeader::decode(std::span<const uint8_t>(buf, sizeof(buf)), 0);
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->type, t);
    h.last = false;
    h.encode(buf);
    EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, sizeof(buf)), 0).is_ok());
  }
  buf[0] = 7;
  buf[1] = 1;
  EXPECT_FALSE(MsgHeader::decode(std::span<const uint8_t>(buf, sizeof(buf)), 0).is_ok());
}

TEST(AuthProof, RoundTripsAndRefusesAnythingButProofAndHello) {
  const Hello h = sample();
  std::vector<uint8_t> proof(kProofSize, 0xab);
  auto bytes = AuthProof::encode(proof, h);
  ASSERT_EQ(bytes.size(), kAuthProofSize);
  EXPECT_LE(bytes.size() + kMsgHeaderSize, kMinMsgSize);
  auto d = AuthProof::decode(bytes, -1);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_TRUE(std::equal(proof.begin(), proof.end(), d->proof.begin(), d->proof.end()));
  EXPECT_EQ(d->hello.rank, 3);
  EXPECT_EQ(d->hello.ring_addr, h.ring_addr);
  bytes.push_back(0);
  EXPECT_EQ(AuthProof::decode(bytes, -1).status().code(), Code::kProtocolError);
  bytes.resize(kProofSize);
  EXPECT_EQ(AuthProof::decode(bytes, -1).status().code(), Code::kProtocolError);
}

TEST(KeyMessages, CheckRoundTrips) {
  KeyCheck k{42, {7, 0xfeedfacecafebeefull, 0x7f0000001000ull, 1 << 20, 0x1234}};
  auto bytes = k.encode();
  EXPECT_LE(bytes.size() + kMsgHeaderSize, kMinMsgSize);
  auto d = KeyCheck::decode(bytes, 1);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->request, 42u);
  EXPECT_EQ(d->claim, k.claim);
  bytes.pop_back();
  auto bad = KeyCheck::decode(bytes, 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kProtocolError);
}

TEST(KeyMessages, ClaimsCompareByEveryField) {
  KeyClaim a{1, KeySecret{2, 6}, 3, 4, 5};
  KeyClaim b = a;
  EXPECT_EQ(a, b);
  b.length = 8;  // an inflated key is a different claim
  EXPECT_NE(a, b);
  b = a;
  b.secret.hi = 9;
  EXPECT_NE(a, b);
  EXPECT_TRUE(a < b || b < a);
}

TEST(KeyMessages, VerdictRoundTripsAndTruncates) {
  KeyVerdict v{9, Code::kOutOfRange, 0, "claims too much"};
  auto d = KeyVerdict::decode(v.encode(), 1);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->request, 9u);
  EXPECT_EQ(d->code, Code::kOutOfRange);
  EXPECT_EQ(d->reason, "claims too much");
  v.reason = std::string(1000, 'x');
  auto bytes = v.encode();
  EXPECT_LE(bytes.size() + kMsgHeaderSize, kMinMsgSize) << "a verdict fits the smallest buffer";
  d = KeyVerdict::decode(bytes, 1);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->reason.size(), kMaxVerdictReason);
  KeyVerdict ok{1, Code::kOk, 0xabcdef12, ""};
  auto got = KeyVerdict::decode(ok.encode(), 1);
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got->rkey, 0xabcdef12u) << "the window's rkey travels with the verdict";
  bytes = ok.encode();
  bytes[8] = 200;  // not a Code
  EXPECT_FALSE(KeyVerdict::decode(bytes, 1).is_ok());
  EXPECT_FALSE(KeyVerdict::decode(std::span<const uint8_t>(bytes.data(), 12), 1).is_ok());
}

TEST(KeyMessages, RevokedRoundTrips) {
  auto d = KeyRevoked::decode(KeyRevoked{77}.encode(), 1);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->key_id, 77u);
  EXPECT_FALSE(KeyRevoked::decode(std::vector<uint8_t>(9), 1).is_ok());
}

TEST(Fragments, PlanCoversTheMessage) {
  using V = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(plan_fragments(0, 100), (V{{0, 0}}));
  EXPECT_EQ(plan_fragments(100, 100), (V{{0, 100}}));
  EXPECT_EQ(plan_fragments(250, 100), (V{{0, 100}, {100, 100}, {200, 50}}));
  EXPECT_EQ(plan_fragments(1, 8184).size(), 1u);
  EXPECT_TRUE(plan_fragments(10, 0).empty());
}

TEST(Fragments, ReassemblerJoinsInOrder) {
  std::vector<uint8_t> msg(1000);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 7);
  MessageReassembler r(1 << 20);
  auto plan = plan_fragments(msg.size(), 300);
  for (size_t i = 0; i < plan.size(); ++i) {
    auto out = r.add(std::span<const uint8_t>(msg.data() + plan[i].first, plan[i].second),
                     i + 1 == plan.size(), 0);
    ASSERT_TRUE(out.is_ok());
    if (i + 1 < plan.size()) {
      EXPECT_FALSE(out->has_value());
    } else {
      ASSERT_TRUE(out->has_value());
      EXPECT_EQ(**out, msg);
    }
  }
  EXPECT_EQ(r.pending_bytes(), 0u);
  // An empty message.
  auto empty = r.add({}, true, 0);
  ASSERT_TRUE(empty.is_ok() && empty->has_value());
  EXPECT_TRUE((*empty)->empty());
}

TEST(Fragments, ReassemblerRefusesOversizedMessages) {
  MessageReassembler r(10);
  std::vector<uint8_t> six(6, 1);
  ASSERT_TRUE(r.add(six, false, 4).is_ok());
  auto over = r.add(six, true, 4);
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.status().code(), Code::kProtocolError);
  EXPECT_EQ(over.status().peer(), 4);
  EXPECT_EQ(r.pending_bytes(), 0u);
}

}  // namespace
}  // namespace rdmaflow::verbs
