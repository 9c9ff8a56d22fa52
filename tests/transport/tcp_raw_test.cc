// What only the tcp backend has: its own framing, attacked from a raw socket
// (every malformed header refused, memory untouched, the listener still
// serving), and the choice of address family. The generic contract is in
// conformance_test.cc; the verbs counterparts are in tests/verbs/raw_peer_test.cc.
#include <cstring>
#include <vector>

#include "tests/transport/conformance_util.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaflow::testing {
namespace {

const BackendRow kTcp = backend_row("tcp");

TEST(TcpConformance, MalformedFramesFromARawSocketAreRefused) {
  using namespace rdmaflow::tcp;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    if (rank == 0) {  // the receiver under attack
      RawPeerTarget target;
      RF_ASSERT_OK(target.start(kTcp, rank, world, ex));
      Node& node = target.node;
      // Each attack connection claims its own rank.
      for (int claimed : {11, 12, 13, 14, 15}) {
        RF_ASSIGN_OR_FAIL(auto ch, target.accept_failed(claimed));
        if (claimed != 15) {
          EXPECT_EQ(ch->error().code(), Code::kProtocolError) << ch->error().to_string();
        }
      }
      // An out-of-range write on a raw connection is refused without breaking the
      // stream; a forged key secret breaks it.
      RF_ASSIGN_OR_FAIL(auto raw, node.transport->accept(16, kOpTimeout));
      RF_ASSERT_OK(ex.barrier());  // rank 1 done
      EXPECT_EQ(raw->error().code(), Code::kUnauthenticated) << raw->error().to_string();
      RF_ASSERT_OK(ex.barrier());  // rank 1 may hang up now
      // The real transport of rank 1 still connects and works.
      RF_ASSIGN_OR_FAIL(auto real, node.transport->accept(1, kOpTimeout));
      RF_ASSIGN_OR_FAIL(uint64_t v, real->inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 7u);
      // Only the two valid writes changed memory.
      fill_pattern(target.expected.p, 100, 555);
      target.expected.p[200] = 1;
      EXPECT_EQ(std::memcmp(target.region.p, target.expected.p, target.region.size), 0)
          << "refused frames changed memory";
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    auto [addr, key_text] = split2(all[0]);
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(key_text));
    // A connection whose handshake is garbage is dropped by the listener.
    {
      RawConn c;
      RF_ASSERT_OK(c.open(addr));
      std::string junk(auth::kHelloBytes, '\x7f');
      RF_ASSERT(c.send(junk.data(), junk.size()));
      RF_ASSERT(c.eof_within(Millis(5000)));
    }
    auto attack = [&](int claimed, const FrameHeader& h, size_t extra, bool close_early) -> int {
      RawConn c;
      RF_ASSERT_OK(c.open(addr));
      RF_ASSERT(c.hello(claimed));
      std::vector<uint8_t> bytes(sizeof(h) + extra, 0x42);
      std::memcpy(bytes.data(), &h, sizeof(h));
      size_t n = close_early ? 20 : bytes.size();
      RF_ASSERT(c.send(bytes.data(), n));
      if (close_early) return 0;
      RF_ASSERT(c.eof_within(Millis(5000)));  // the receiver hung up
      return 0;
    };
    FrameHeader bad_magic;
    bad_magic.magic = 0xdeadbeef;
    RF_ASSERT(attack(11, bad_magic, 0, false) == 0);
    FrameHeader bad_type;
    bad_type.type = 99;
    RF_ASSERT(attack(12, bad_type, 0, false) == 0);
    FrameHeader huge_write;
    huge_write.type = static_cast<uint8_t>(FrameType::kWrite);
    huge_write.length = 1ull << 40;
    huge_write.total = 1ull << 40;
    huge_write.key_id = key.key_id;
    huge_write.secret = key.secret;
    huge_write.flags = kFlagFirst | kFlagLast;
    RF_ASSERT(attack(13, huge_write, 0, false) == 0);
    FrameHeader huge_msg;
    huge_msg.type = static_cast<uint8_t>(FrameType::kMessage);
    huge_msg.length = 1ull << 40;
    RF_ASSERT(attack(14, huge_msg, 0, false) == 0);
    FrameHeader truncated;
    RF_ASSERT(attack(15, truncated, 0, true) == 0);
    {
      RawConn c;
      RF_ASSERT_OK(c.open(addr));
      RF_ASSERT(c.hello(16));
      // Out of range with the right secret: refused, payload consumed, NACK.
      FrameHeader w;
      w.type = static_cast<uint8_t>(FrameType::kWrite);
      w.flags = kFlagFirst | kFlagLast | kFlagHasNotify;
      w.op_id = 2;
      w.key_id = key.key_id;
      w.secret = key.secret;
      w.length = w.total = 4096;
      w.offset = key.length - 10;
      std::vector<uint8_t> payload(4096, 0xAB);
      RF_ASSERT(c.send(&w, sizeof(w)) && c.send(payload.data(), payload.size()));
      FrameHeader reply;
      RF_ASSERT(c.recv(&reply, sizeof(reply), Millis(5000)));
      EXPECT_EQ(reply.type, static_cast<uint8_t>(FrameType::kWriteNack));
      EXPECT_EQ(reply.code, static_cast<uint16_t>(Code::kOutOfRange));
      std::string reason(reply.length, '\0');
      RF_ASSERT(c.recv(reason.data(), reason.size(), Millis(5000)));
      // Then a valid write on the same stream is applied and ACKed.
      std::vector<uint8_t> good(100);
      fill_pattern(good.data(), good.size(), 555);
      w.op_id = 3;
      w.offset = 0;
      w.length = w.total = good.size();
      w.flags = kFlagFirst | kFlagLast;
      RF_ASSERT(c.send(&w, sizeof(w)) && c.send(good.data(), good.size()));
      RF_ASSERT(c.recv(&reply, sizeof(reply), Millis(5000)));
      EXPECT_EQ(reply.type, static_cast<uint8_t>(FrameType::kWriteAck));
      EXPECT_EQ(reply.op_id, 3u);
      // A forged secret (one bit off) is not answered: the receiver hangs up before
      // reading the payload, and the channel is failed.
      w.op_id = 4;
      w.secret.hi ^= 1;
      w.offset = 4096;
      w.length = w.total = payload.size();
      RF_ASSERT(c.send(&w, sizeof(w)));
      (void)c.send(payload.data(), payload.size());  // may meet the closed socket
      RF_ASSERT(c.eof_within(Millis(5000)));
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
    }
    Node node;
    RF_ASSERT_OK(node.create(kTcp, rank, world, ex));
    RF_ASSIGN_OR_FAIL(auto ch, node.transport->connect(0, addr, kOpTimeout));
    uint8_t byte = 1;
    RF_ASSERT_OK(write_sync(*ch, &byte, 1, key, 200, 7));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(TcpConformance, WorksOverIpv6Loopback) {
  if (!ipv6_loopback_available()) GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  auto r = run_over_ipv6(kTcp, "::1");
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
