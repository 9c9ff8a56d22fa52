// The verbs backend against peers that are not rdmaflow: a raw RDMA CM client
// whose connect request carries junk or a lying hello, and whose SENDs carry
// malformed messages. Every one is refused with the reason, memory is left
// untouched, and the listener keeps serving real peers. Also: connections over
// an IPv6 address of the RDMA netdev. Both need a device (docs/soft-roce.md;
// scripts/softroce-vm runs them in a guest) and skip with the reason without.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tests/transport/conformance_util.h"
#include "tests/verbs/raw_verbs_peer.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaflow::testing {
namespace {

const BackendRow kVerbs = backend_row("verbs");

std::vector<uint8_t> hello_claiming(int rank) {
  verbs::Hello h;
  h.rank = rank;
  h.credits = 4;
  h.msg_size = 4096;
  h.ring_slots = 4;
  h.ring_rkey = 1;
  h.ring_addr = 4096;
  return h.encode();
}

std::vector<uint8_t> message(verbs::MsgType type, size_t payload) {
  std::vector<uint8_t> m(verbs::kMsgHeaderSize + payload, 0x42);
  verbs::MsgHeader h;
  h.type = type;
  h.encode(m.data());
  return m;
}

TEST(VerbsRawPeer, MalformedHellosAndMessagesAreRefused) {
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    if (rank == 0) {  // the listener under attack
      RawPeerTarget target;
      RF_ASSERT_OK(target.start(kVerbs, rank, world, ex));
      // A lying hello gets a channel; its first malformed message fails it.
      for (int claimed : {11, 12, 13}) {
        RF_ASSIGN_OR_FAIL(auto ch, target.accept_failed(claimed));
        EXPECT_EQ(ch->error().code(), Code::kProtocolError) << ch->error().to_string();
      }
      RF_ASSERT_OK(ex.barrier());  // the raw peer is done
      RF_ASSIGN_OR_FAIL(auto real, target.node.transport->accept(1, kOpTimeout));
      RF_ASSIGN_OR_FAIL(uint64_t v, real->inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 7u);
      target.expected.p[200] = 1;  // the one valid write
      EXPECT_EQ(std::memcmp(target.region.p, target.expected.p, target.region.size), 0)
          << "refused peers changed memory";
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    Node node;  // also ends this rank as skipped where verbs is not viable
    RF_ASSERT_OK(node.create(kVerbs, rank, world, ex));
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    auto [addr, key_text] = split2(all[0]);
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(key_text));
    // Connect requests whose private data is not a hello are rejected with the reason.
    auto refused = [&](std::vector<uint8_t> pdata, const std::string& reason) -> int {
      RawVerbsPeer p;
      Status st = p.connect(addr, pdata, kOpTimeout);
      EXPECT_EQ(st.code(), Code::kConnectionFailed) << st.to_string();
      EXPECT_NE(st.reason().find(reason), std::string::npos) << st.to_string();
      return 0;
    };
    refused(std::vector<uint8_t>(16, 0x7f), "not an rdmaflow verbs transport");
    refused({}, "not an rdmaflow verbs transport");
    auto old = hello_claiming(1);
    old[4] = 9;  // version 9
    refused(old, "hello version 9");
    auto negative = hello_claiming(-5);
    refused(negative, "negative rank");
    auto no_credits = hello_claiming(1);
    no_credits[12] = 1;  // one credit
    refused(no_credits, "receive credits");
    // A valid hello, then a message the listener cannot parse: the channel fails.
    auto attack = [&](int claimed, const std::vector<uint8_t>& bytes) -> int {
      RawVerbsPeer p;
      RF_ASSERT_OK(p.connect(addr, hello_claiming(claimed), kOpTimeout));
      RF_ASSERT_OK(p.send(bytes, kOpTimeout));
      EXPECT_TRUE(p.disconnected_within(kOpTimeout)) << "rank 0 kept a channel that sent garbage";
      return 0;
    };
    auto bad_type = message(verbs::MsgType::kData, 8);
    bad_type[0] = 99;
    RF_ASSERT(attack(11, bad_type) == 0);
    RF_ASSERT(attack(12, std::vector<uint8_t>(3, 0x11)) == 0);          // shorter than a header
    RF_ASSERT(attack(13, message(verbs::MsgType::kKeyCheck, 5)) == 0);  // truncated key check
    RF_ASSERT_OK(ex.barrier());
    RF_ASSIGN_OR_FAIL(auto ch, node.transport->connect(0, addr, kOpTimeout));
    Buffer src(4096);
    src.p[0] = 1;
    RF_ASSERT_OK(node.local(src));
    RF_ASSERT_OK(write_sync(*ch, src.p, 1, key, 200, 7));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A global (not link-local) IPv6 address on the netdev of an RDMA port, or "".
std::string rdma_netdev_ipv6() {
  namespace fs = std::filesystem;
  std::vector<std::string> netdevs;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    for (const auto& f : fs::directory_iterator(dev.path() / "ports/1/gid_attrs/ndevs", ec)) {
      std::ifstream in(f.path());
      std::string name;
      if (in >> name) netdevs.push_back(name);
    }
  }
  ifaddrs* list = nullptr;
  if (netdevs.empty() || getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* a = list; a != nullptr && out.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET6) continue;
    if (std::find(netdevs.begin(), netdevs.end(), a->ifa_name) == netdevs.end()) continue;
    const in6_addr& ip = reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr;
    if (IN6_IS_ADDR_LINKLOCAL(&ip) || IN6_IS_ADDR_LOOPBACK(&ip)) continue;
    char buf[INET6_ADDRSTRLEN];
    if (inet_ntop(AF_INET6, &ip, buf, sizeof buf)) out = buf;
  }
  freeifaddrs(list);
  return out;
}

TEST(VerbsIpv6, ConnectsWritesAndReadsOverAnIpv6Address) {
  const std::string ip = rdma_netdev_ipv6();
  if (ip.empty()) {
    GTEST_SKIP() << "no RDMA netdev with a global IPv6 address here (scripts/softroce-vm gives "
                    "its guests fd77::<n>/64)";
  }
  auto r = run_over_ipv6(kVerbs, ip);
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
