#include <gtest/gtest.h>

#include "transport/verbs/gid.h"

namespace rdmaflow::verbs {
namespace {

GidBytes mapped(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  GidBytes g{};
  g[10] = 0xff;
  g[11] = 0xff;
  g[12] = a;
  g[13] = b;
  g[14] = c;
  g[15] = d;
  return g;
}

GidBytes link_local(uint8_t last) {
  GidBytes g{};
  g[0] = 0xfe;
  g[1] = 0x80;
  g[15] = last;
  return g;
}

// What an rxe link on a netdev with 10.0.0.1 and an IPv6 link-local address shows.
std::vector<GidEntry> rxe_table() {
  return {{0, GidType::kRoCEv1, link_local(1)},
          {1, GidType::kRoCEv2, link_local(1)},
          {2, GidType::kRoCEv1, mapped(10, 0, 0, 1)},
          {3, GidType::kRoCEv2, mapped(10, 0, 0, 1)}};
}

TEST(GidChoice, PrefersRoceV2Ipv4Mapped) {
  auto c = choose_gid(rxe_table(), std::nullopt);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->entry.index, 3u);
  EXPECT_EQ(c->entry.type, GidType::kRoCEv2);
  ASSERT_TRUE(c->ipv4.has_value());
  EXPECT_EQ(*c->ipv4, "10.0.0.1");
  EXPECT_NE(c->reason.find("index 3 (RoCE v2, ::ffff:10.0.0.1)"), std::string::npos) << c->reason;
  EXPECT_NE(c->reason.find("first RoCE v2 IPv4-mapped"), std::string::npos) << c->reason;
}

TEST(GidChoice, OrderOfTableDoesNotMatter) {
  auto t = rxe_table();
  std::reverse(t.begin(), t.end());
  auto c = choose_gid(t, std::nullopt);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 3u);
}

TEST(GidChoice, MatchesWantedAddressAmongSeveral) {
  auto t = rxe_table();
  t.push_back({4, GidType::kRoCEv1, mapped(192, 168, 1, 7)});
  t.push_back({5, GidType::kRoCEv2, mapped(192, 168, 1, 7)});
  auto c = choose_gid(t, std::nullopt, std::string("192.168.1.7"));
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 5u);
  EXPECT_NE(c->reason.find("of 192.168.1.7"), std::string::npos) << c->reason;

  auto miss = choose_gid(t, std::nullopt, std::string("172.16.0.1"));
  ASSERT_TRUE(miss.is_ok());
  EXPECT_EQ(miss->entry.index, 3u);  // the first RoCE v2 IPv4 one
  EXPECT_NE(miss->reason.find("none holds 172.16.0.1"), std::string::npos) << miss->reason;
}

TEST(GidChoice, OverrideIsHonouredAndExplained) {
  auto c = choose_gid(rxe_table(), 2u);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 2u);
  EXPECT_EQ(c->entry.type, GidType::kRoCEv1);
  EXPECT_NE(c->reason.find("RDMAFLOW_IB_GID_INDEX"), std::string::npos) << c->reason;
  EXPECT_NE(c->reason.find("not a RoCE v2 IPv4-mapped GID"), std::string::npos) << c->reason;

  auto v2 = choose_gid(rxe_table(), 3u);
  ASSERT_TRUE(v2.is_ok());
  EXPECT_EQ(v2->reason.find("not a RoCE v2"), std::string::npos) << v2->reason;
}

TEST(GidChoice, OverrideOfMissingOrEmptyIndexIsAnError) {
  auto t = rxe_table();
  t.push_back({9, GidType::kRoCEv2, GidBytes{}});  // an unused (zero) slot
  for (uint32_t idx : {7u, 9u}) {
    auto c = choose_gid(t, idx);
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().reason().find("RDMAFLOW_IB_GID_INDEX=" + std::to_string(idx)),
              std::string::npos);
    // Lists what is valid so the user can pick.
    EXPECT_NE(c.status().reason().find("index 3 (RoCE v2, ::ffff:10.0.0.1)"), std::string::npos)
        << c.status().reason();
  }
}

TEST(GidChoice, FallsBackInOrder) {
  // Only IPv6 RoCE v2 and IPv4 RoCE v1: the v2 one wins.
  std::vector<GidEntry> t = {{0, GidType::kRoCEv1, mapped(10, 1, 1, 1)},
                             {1, GidType::kRoCEv2, link_local(2)}};
  auto c = choose_gid(t, std::nullopt);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 1u);
  EXPECT_FALSE(c->ipv4.has_value());

  // Only RoCE v1.
  t = {{0, GidType::kRoCEv1, link_local(2)}, {1, GidType::kRoCEv1, mapped(10, 1, 1, 1)}};
  c = choose_gid(t, std::nullopt);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 1u);
  EXPECT_NE(c->reason.find("RoCE v1"), std::string::npos);

  // InfiniBand: the port GID at index 0.
  t = {{0, GidType::kIB, link_local(3)}, {1, GidType::kIB, link_local(4)}};
  c = choose_gid(t, std::nullopt);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->entry.index, 0u);
  EXPECT_NE(c->reason.find("InfiniBand"), std::string::npos) << c->reason;
}

TEST(GidChoice, EmptyTableIsNotViable) {
  std::vector<GidEntry> t = {{0, GidType::kRoCEv2, GidBytes{}}, {1, GidType::kRoCEv1, GidBytes{}}};
  for (auto table : {t, std::vector<GidEntry>{}}) {
    auto c = choose_gid(table, std::nullopt);
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().code(), Code::kNotViable);
    EXPECT_NE(c.status().reason().find("no valid entry"), std::string::npos);
  }
}

TEST(GidText, FormatsAndParses) {
  EXPECT_EQ(gid_to_string(mapped(10, 0, 0, 1)), "::ffff:10.0.0.1");
  EXPECT_EQ(gid_to_string(link_local(0xab)), "fe80:0000:0000:0000:0000:0000:0000:00ab");
  EXPECT_EQ(gid_ipv4(mapped(192, 168, 0, 255)), std::optional<std::string>("192.168.0.255"));
  EXPECT_FALSE(gid_ipv4(link_local(1)).has_value());
  GidBytes almost = mapped(1, 2, 3, 4);
  almost[9] = 1;  // not ::ffff:0:0/96
  EXPECT_FALSE(gid_ipv4(almost).has_value());
  EXPECT_TRUE(gid_is_zero(GidBytes{}));
  EXPECT_FALSE(gid_is_zero(link_local(0)));

  EXPECT_EQ(parse_sysfs_gid_type("RoCE v2\n"), GidType::kRoCEv2);
  EXPECT_EQ(parse_sysfs_gid_type("RoCE v2"), GidType::kRoCEv2);
  EXPECT_EQ(parse_sysfs_gid_type("IB/RoCE v1\n"), GidType::kRoCEv1);
  EXPECT_EQ(parse_sysfs_gid_type("IB"), GidType::kIB);
  EXPECT_EQ(parse_sysfs_gid_type(""), GidType::kUnknown);
  EXPECT_EQ(parse_sysfs_gid_type("RoCE v3"), GidType::kUnknown);
  EXPECT_EQ(gid_type_name(GidType::kRoCEv2), "RoCE v2");
}

}  // namespace
}  // namespace rdmaflow::verbs
