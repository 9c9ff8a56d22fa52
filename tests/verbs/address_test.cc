#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <optional>
#include <string>

#include "transport/verbs/verbs_address.h"

namespace rdmaflow::verbs {
namespace {

// RoCE devices reach each other on one IPv4 subnet; a device whose subnet is
// unknown ("roce") is taken to reach any RoCE device.
TEST(VerbsFabric, RoceSubnetsAndInfinibandPrefixes) {
  EXPECT_TRUE(fabrics_reach("roce 10.0.0.0/24", "roce 10.0.0.0/24"));
  EXPECT_FALSE(fabrics_reach("roce 10.0.0.0/24", "roce 10.0.1.0/24"));
  EXPECT_TRUE(fabrics_reach("roce", "roce 10.0.1.0/24"));
  EXPECT_TRUE(fabrics_reach("roce 10.0.1.0/24", "roce"));
  EXPECT_FALSE(fabrics_reach("roce", "ib fe80000000000000"));
  EXPECT_TRUE(fabrics_reach("ib fe80000000000000", "ib fe80000000000000"));
  EXPECT_FALSE(fabrics_reach("", ""));
  EXPECT_FALSE(fabrics_reach("rocex", "roce"));
}

TEST(VerbsAddress, ParsesIpv4AndIpv6) {
  auto a = parse_verbs_address("verbs://10.0.0.1:18515");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 18515);
  EXPECT_FALSE(a->ipv6);
  EXPECT_EQ(format_verbs_address(*a), "verbs://10.0.0.1:18515");

  auto b = parse_verbs_address("verbs://[fe80::1]:7000");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->host, "fe80::1");
  EXPECT_TRUE(b->ipv6);
  EXPECT_EQ(format_verbs_address(*b), "verbs://[fe80::1]:7000");

  auto c = parse_verbs_address("verbs://[::ffff:192.168.1.2]:65535");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->port, 65535);
}

TEST(VerbsAddress, RejectsMalformedWithAReason) {
  struct Case {
    const char* text;
    const char* why;
  };
  for (const Case& c :
       {Case{"10.0.0.1:1", "missing 'verbs://'"}, Case{"tcp://10.0.0.1:1", "missing 'verbs://'"},
        Case{"verbs://10.0.0.1", "missing ':<port>'"}, Case{"verbs://10.0.0.1:", "not a number"},
        Case{"verbs://10.0.0.1:0", "out of range"}, Case{"verbs://10.0.0.1:70000", "out of range"},
        Case{"verbs://10.0.0.1:12x", "not a number"}, Case{"verbs://10.0.0.1:-5", "not a number"},
        Case{"verbs://:5", "empty host"}, Case{"verbs://node7:5", "not a numeric IPv4"},
        Case{"verbs://10.0.0.256:5", "not a numeric IPv4"},
        Case{"verbs://fe80::1:5", "must be written in brackets"},
        Case{"verbs://[fe80::1:5", "unterminated"},
        Case{"verbs://[fe80::1]5", "missing ':<port>' after ']'"},
        Case{"verbs://[zz::1]:5", "not a numeric IPv6"}, Case{"verbs://[]:5", "empty host"}}) {
    auto r = parse_verbs_address(c.text);
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().reason().find(c.why), std::string::npos)
        << c.text << " -> " << r.status().reason();
    EXPECT_NE(r.status().reason().find(c.text), std::string::npos) << "names the input";
  }
}

TEST(VerbsAddress, FillsSockaddr) {
  sockaddr_storage ss{};
  auto len = to_sockaddr({"10.1.2.3", 4791, false}, &ss);
  ASSERT_TRUE(len.is_ok());
  EXPECT_EQ(*len, sizeof(sockaddr_in));
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  EXPECT_EQ(s4->sin_family, AF_INET);
  EXPECT_EQ(ntohs(s4->sin_port), 4791);
  EXPECT_EQ(ntohl(s4->sin_addr.s_addr), 0x0a010203u);

  len = to_sockaddr({"::1", 80, true}, &ss);
  ASSERT_TRUE(len.is_ok());
  EXPECT_EQ(*len, sizeof(sockaddr_in6));
  EXPECT_EQ(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_family, AF_INET6);

  EXPECT_FALSE(to_sockaddr({"fe80::1%no_such_if0", 80, true}, &ss).is_ok());
  EXPECT_FALSE(to_sockaddr({"1.2.3", 80, false}, &ss).is_ok());
}

TEST(VerbsAddress, Loopback) {
  EXPECT_TRUE(is_loopback_ip("127.0.0.1"));
  EXPECT_TRUE(is_loopback_ip("127.255.0.9"));
  EXPECT_TRUE(is_loopback_ip("::1"));
  EXPECT_TRUE(is_loopback_ip("::ffff:127.0.0.1"));
  EXPECT_FALSE(is_loopback_ip("10.0.0.1"));
  EXPECT_FALSE(is_loopback_ip("fe80::1"));
  EXPECT_FALSE(is_loopback_ip("lo"));
  EXPECT_FALSE(is_loopback_ip(""));
}

// The RoCE fabric name transport selection compares: the GID address's subnet.
TEST(VerbsAddress, SubnetsAndTheRoceFabric) {
  EXPECT_EQ(ipv4_subnet("10.0.0.7", 24), "10.0.0.0/24");
  EXPECT_EQ(ipv4_subnet("192.168.13.200", 20), "192.168.0.0/20");
  EXPECT_EQ(ipv4_subnet("10.1.2.3", 32), "10.1.2.3/32");
  EXPECT_EQ(ipv4_subnet("10.1.2.3", 0), "0.0.0.0/0");
  EXPECT_FALSE(ipv4_subnet("10.1.2", 24));
  EXPECT_FALSE(ipv4_subnet("10.1.2.3", 33));
  EXPECT_FALSE(ipv4_subnet("fe80::1", 64));
  // A real interface of this machine: loopback holds 127.0.0.1/8.
  EXPECT_EQ(local_ipv4_subnet("127.0.0.1"), "127.0.0.0/8");
  EXPECT_EQ(roce_fabric(std::string("127.0.0.1")), "roce 127.0.0.0/8");
  // No interface holds a documentation address; no address at all.
  EXPECT_FALSE(local_ipv4_subnet("203.0.113.9"));
  EXPECT_EQ(roce_fabric(std::string("203.0.113.9")), "roce");
  EXPECT_EQ(roce_fabric(std::nullopt), "roce");
}

}  // namespace
}  // namespace rdmaflow::verbs
