// The verbs backend against peers that are not rdmaflow: a raw RDMA CM client
// whose connect request carries junk, whose handshake lies or fails, whose SENDs
// carry malformed messages, and which tries RDMA writes and reads with a genuine
// key without having proved the job secret. Every one is refused with the
// reason, memory is left untouched, and the listener keeps serving real peers.
// Also: connections over
// an IPv6 address of the RDMA netdev. Both need a device (docs/soft-roce.md;
// scripts/softroce-vm runs them in a guest) and skip with the reason without.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "common/handshake.h"
#include "common/job_secret.h"
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

// The connector's half of the job handshake, done by hand (verbs_wire.h): the
// hello for the connect request, then the first SEND, answering the listener's
// challenge with `hello` (a verbs Hello's bytes, possibly lying) behind the proof.
struct RawAuth {
  auth::Connector connector;
  explicit RawAuth(JobSecret secret) : connector(std::move(secret), "verbs") {}
  RawAuth() : RawAuth(load_job_secret().value()) {}

  std::vector<uint8_t> hello() {
    auto h = connector.hello();
    return h.is_ok() ? std::vector<uint8_t>(h->begin(), h->end()) : std::vector<uint8_t>();
  }
  Result<std::vector<uint8_t>> first_message(const RawVerbsPeer& p,
                                             const std::vector<uint8_t>& hello) {
    const auto& got = p.accept_data();
    if (got.size() < auth::kChallengeBytes) {
      return RDMAFLOW_ERROR(Code::kProtocolError, "raw auth", -1,
                            "the accept carries no challenge");
    }
    RDMAFLOW_ASSIGN_OR_RETURN(
        auth::Proof proof,
        connector.answer(std::span<const uint8_t>(got).first(auth::kChallengeBytes), "listener"));
    return with_header(verbs::MsgType::kAuth, proof, hello);
  }
  static std::vector<uint8_t> with_header(verbs::MsgType type, std::span<const uint8_t> proof,
                                          const std::vector<uint8_t>& hello) {
    std::vector<uint8_t> m(verbs::kMsgHeaderSize);
    verbs::MsgHeader h;
    h.type = type;
    h.encode(m.data());
    m.insert(m.end(), proof.begin(), proof.end());
    m.insert(m.end(), hello.begin(), hello.end());
    return m;
  }
};

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
    // Connect requests whose private data is not the job handshake's hello (junk,
    // nothing, an older rdmaflow's verbs hello) are rejected with the reason.
    auto refused = [&](std::vector<uint8_t> pdata) -> int {
      RawVerbsPeer p;
      Status st = p.connect(addr, pdata, kOpTimeout);
      EXPECT_EQ(st.code(), Code::kConnectionFailed) << st.to_string();
      EXPECT_NE(st.reason().find("did not start with the rdmaflow handshake"), std::string::npos)
          << st.to_string();
      return 0;
    };
    refused(std::vector<uint8_t>(16, 0x7f));
    refused({});
    refused(hello_claiming(1));
    // An authenticated peer whose Hello (behind its proof) is refused loses the connection.
    auto lying = [&](const std::vector<uint8_t>& hello) -> int {
      RawVerbsPeer p;
      RawAuth a;
      RF_ASSERT_OK(p.connect(addr, a.hello(), kOpTimeout));
      RF_ASSIGN_OR_FAIL(auto first, a.first_message(p, hello));
      RF_ASSERT_OK(p.send(first, kOpTimeout));
      EXPECT_TRUE(p.disconnected_within(kOpTimeout)) << "rank 0 kept a peer with a bad hello";
      return 0;
    };
    auto old = hello_claiming(1);
    old[4] = 9;  // version 9
    RF_ASSERT(lying(old) == 0);
    RF_ASSERT(lying(hello_claiming(-5)) == 0);  // negative rank
    auto no_credits = hello_claiming(1);
    no_credits[12] = 1;  // one credit
    RF_ASSERT(lying(no_credits) == 0);
    // A valid handshake and hello, then a message the listener cannot parse: the channel fails.
    auto attack = [&](int claimed, const std::vector<uint8_t>& bytes) -> int {
      RawVerbsPeer p;
      RawAuth a;
      RF_ASSERT_OK(p.connect(addr, a.hello(), kOpTimeout));
      RF_ASSIGN_OR_FAIL(auto first, a.first_message(p, hello_claiming(claimed)));
      RF_ASSERT_OK(p.send(first, kOpTimeout));
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

// A peer that skips rdmaflow's checks and holds a genuine key (learned out of
// band): without proving the job secret, its RDMA writes and reads are refused
// by the NIC (the listener's queue pair allows no remote access before the
// proof), a forged proof loses the connection, and no byte of the granted
// region changes.
TEST(VerbsRawPeer, PeersThatDoNotProveTheJobSecretReachNoMemory) {
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    if (rank == 0) {
      RawPeerTarget target;
      RF_ASSERT_OK(target.start(kVerbs, rank, world, ex));
      RF_ASSERT_OK(ex.barrier());  // the raw peer is done
      auto stray = target.node.transport->accept(1, Millis(200));
      EXPECT_FALSE(stray.is_ok()) << "a peer that did not prove the job secret got a channel";
      EXPECT_EQ(std::memcmp(target.region.p, target.expected.p, target.region.size), 0)
          << "an unauthenticated peer changed memory";
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    Node node;
    RF_ASSERT_OK(node.create(kVerbs, rank, world, ex));
    RF_ASSIGN_OR_FAIL(auto target, raw_target_of(ex));
    auto [addr, key] = target;
    uint32_t rkey = 0;
    RF_ASSERT(key.blob.size() == 4);
    std::memcpy(&rkey, key.blob.data(), 4);
    const JobSecret wrong{SecretSource::kEnv, std::vector<uint8_t>(32, static_cast<uint8_t>('w')),
                          "a wrong secret"};
    // Right after the accept, before any proof: the write and the read fail.
    for (const bool write : {true, false}) {
      RawVerbsPeer p;
      RawAuth a(wrong);
      RF_ASSERT_OK(p.connect(addr, a.hello(), kOpTimeout));
      Status st = p.rdma(write, key.addr, rkey, 256, kOpTimeout);
      std::printf("an RDMA %s before the proof: %s\n", write ? "write" : "read",
                  st.to_string().c_str());
      EXPECT_FALSE(st.is_ok()) << (write ? "an RDMA write" : "an RDMA read")
                               << " before the proof succeeded";
    }
    // A forged proof (with a valid hello behind it): the connection is dropped,
    // and a write after it fails.
    {
      RawVerbsPeer p;
      RawAuth a(wrong);
      RF_ASSERT_OK(p.connect(addr, a.hello(), kOpTimeout));
      const std::vector<uint8_t> forged(auth::kProofBytes, 0x33);
      RF_ASSERT_OK(p.send(RawAuth::with_header(verbs::MsgType::kAuth, forged, hello_claiming(1)),
                          kOpTimeout));
      EXPECT_TRUE(p.disconnected_within(kOpTimeout)) << "rank 0 kept a peer with a forged proof";
      EXPECT_FALSE(p.rdma(true, key.addr, rkey, 256, Millis(3000)).is_ok());
    }
    RF_ASSERT_OK(ex.barrier());
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Grant windows: a peer that proved the job secret and got the target's verdict
// on a genuine key, then skips every other check, reaches exactly the grant. The
// NIC refuses a write past the grant's end and a read before its start (both
// inside the registered slab), any access with the slab's own rkey, and the
// grant's window once the grant is revoked; only the writes inside the grant
// land. `protection` is RDMAFLOW_IB_GRANT_PROTECTION's value (nullptr: unset).
void expect_a_peer_confined_to_its_grant(const char* protection) {
  constexpr size_t kSlab = 64 << 10;
  constexpr size_t kAt = 16 << 10;  // the grant: [kAt, kAt + kLen) of the slab
  constexpr size_t kLen = 4 << 10;
  if (protection != nullptr) {
    ::setenv("RDMAFLOW_IB_GRANT_PROTECTION", protection, 1);
  } else {
    ::unsetenv("RDMAFLOW_IB_GRANT_PROTECTION");
  }
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.create(kVerbs, rank, world, ex));
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(std::string addr, node.transport->listen());
      Buffer slab(kSlab);
      std::memset(slab.p, 0, slab.size);
      RF_ASSERT_OK(node.transport->register_memory(slab.p, slab.size).status());
      RF_ASSIGN_OR_FAIL(RemoteKey grant, node.transport->export_key(slab.p + kAt, kLen));
      RF_ASSERT_OK(ex.allgather(join2(addr, key_bytes(grant))));
      RF_ASSERT_OK(ex.barrier());  // a peer wrote through its window
      RF_ASSERT_OK(node.transport->revoke_key(grant));
      RF_ASSERT_OK(ex.barrier());  // it tried again after the revoke
      RF_ASSERT_OK(ex.barrier());
      for (size_t i = 0; i < kSlab; ++i) {
        const uint8_t want = (i >= kAt && i < kAt + kLen) ? 0x5a : 0;
        if (slab.p[i] != want) {
          ADD_FAILURE() << "byte " << i << " of the slab is " << int(slab.p[i]) << ", expected "
                        << int(want) << " (the grant is [" << kAt << ", " << kAt + kLen << "))";
          break;
        }
      }
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto target, raw_target_of(ex));
    auto [addr, key] = target;
    uint32_t slab_rkey = 0;
    RF_ASSERT(key.blob.size() == 4);
    std::memcpy(&slab_rkey, key.blob.data(), 4);
    // Connects, proves the secret, presents the key: the window's rkey.
    auto open = [&, addr = addr, key = key](RawVerbsPeer& p) -> Result<uint32_t> {
      RawAuth a;
      RDMAFLOW_RETURN_IF_ERROR(p.connect(addr, a.hello(), kOpTimeout));
      RDMAFLOW_ASSIGN_OR_RETURN(auto first, a.first_message(p, hello_claiming(1)));
      RDMAFLOW_RETURN_IF_ERROR(p.send(first, kOpTimeout));
      verbs::KeyCheck check{1, {key.key_id, key.secret, key.addr, key.length, slab_rkey}};
      std::vector<uint8_t> msg(verbs::kMsgHeaderSize);
      verbs::MsgHeader h;
      h.type = verbs::MsgType::kKeyCheck;
      h.encode(msg.data());
      auto body = check.encode();
      msg.insert(msg.end(), body.begin(), body.end());
      RDMAFLOW_RETURN_IF_ERROR(p.send(msg, kOpTimeout));
      RDMAFLOW_ASSIGN_OR_RETURN(auto reply, p.recv(kOpTimeout));
      auto std_reply = std::span<const uint8_t>(reply);
      RDMAFLOW_ASSIGN_OR_RETURN(auto rh, verbs::MsgHeader::decode(std_reply, 0));
      if (rh.type != verbs::MsgType::kKeyVerdict) {
        return RDMAFLOW_ERROR(Code::kProtocolError, "raw key check", 0, "no verdict");
      }
      RDMAFLOW_ASSIGN_OR_RETURN(
          auto v, verbs::KeyVerdict::decode(std_reply.subspan(verbs::kMsgHeaderSize), 0));
      if (v.code != Code::kOk || v.rkey == 0 || v.rkey == slab_rkey) {
        return RDMAFLOW_ERROR(Code::kProtocolError, "raw key check", 0,
                              "verdict " + std::to_string(int(v.code)) + " rkey " +
                                  std::to_string(v.rkey) + ": " + v.reason);
      }
      return v.rkey;
    };
    auto report = [](const char* what, const Status& st) {
      std::printf("%s: %s\n", what, st.is_ok() ? "ok" : st.to_string().c_str());
    };
    {
      RawVerbsPeer p;
      RF_ASSIGN_OR_FAIL(uint32_t window, open(p));
      RF_ASSERT_OK(p.rdma(true, key.addr, window, kLen, kOpTimeout));  // the whole grant
      Status past = p.rdma(true, key.addr + kLen, window, 256, kOpTimeout);
      report("a write past the grant's end, inside the slab", past);
      EXPECT_FALSE(past.is_ok()) << "the window let a write past the grant through";
    }
    {
      RawVerbsPeer p;
      RF_ASSIGN_OR_FAIL(uint32_t window, open(p));
      Status before = p.rdma(false, key.addr - 256, window, 256, kOpTimeout);
      report("a read before the grant's start, inside the slab", before);
      EXPECT_FALSE(before.is_ok()) << "the window let a read outside the grant through";
    }
    {
      RawVerbsPeer p;
      RF_ASSIGN_OR_FAIL(uint32_t window, open(p));
      (void)window;
      Status slab = p.rdma(true, key.addr, slab_rkey, 256, kOpTimeout, 0x66);
      report("a write with the slab's rkey", slab);
      EXPECT_FALSE(slab.is_ok()) << "the slab's rkey opened memory";
    }
    {
      RawVerbsPeer p;
      RF_ASSIGN_OR_FAIL(uint32_t window, open(p));
      RF_ASSERT_OK(p.rdma(true, key.addr, window, 256, kOpTimeout));
      RF_ASSERT_OK(ex.barrier());  // rank 0 revokes the grant
      RF_ASSERT_OK(ex.barrier());
      Status revoked = p.rdma(true, key.addr, window, 256, kOpTimeout, 0x77);
      report("a write through the window of a revoked grant", revoked);
      EXPECT_FALSE(revoked.is_ok()) << "a revoked grant's window still opened memory";
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  ::unsetenv("RDMAFLOW_IB_GRANT_PROTECTION");
  RF_EXPECT_RUN_OK(r);
}

// Whether the RDMA device the backend would pick (RDMAFLOW_IB_DEVICE, or the
// first) supports type 2 memory windows; nullopt without a device.
std::optional<bool> device_has_type2_windows() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return std::nullopt;
  std::optional<bool> has;
  const char* want = std::getenv("RDMAFLOW_IB_DEVICE");
  for (int i = 0; i < n && !has; ++i) {
    if (want != nullptr && *want != 0 && std::strcmp(ibv_get_device_name(list[i]), want) != 0) {
      continue;
    }
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr a{};
    has = ibv_query_device(ctx, &a) == 0 &&
          (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && a.max_mw > 0;
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return has;
}

TEST(VerbsRawPeer, GrantWindowsConfineAPeerToItsGrant) {
  expect_a_peer_confined_to_its_grant("window");
}

// The default (auto) is windows wherever the device has them.
TEST(VerbsRawPeer, ByDefaultGrantWindowsConfineAPeerToItsGrant) {
  if (device_has_type2_windows() == false) {
    GTEST_SKIP() << "this RDMA device has no type 2 memory windows, so auto means slab";
  }
  expect_a_peer_confined_to_its_grant(nullptr);
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
