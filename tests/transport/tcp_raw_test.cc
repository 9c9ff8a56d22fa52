// What only the tcp backend has: its own framing, attacked from a raw socket
// (every malformed header refused, memory untouched, the listener still
// serving), and the choice of address family. The generic contract is in
// conformance_test.cc; the verbs counterparts are in tests/verbs/raw_peer_test.cc.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_util.h"
#include "transport/tcp/tcp_channel.h"
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
    RF_ASSIGN_OR_FAIL(auto target, raw_target_of(ex));
    const std::string& addr = target.first;
    const RemoteKey& key = target.second;
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

// The limits on what a peer may send (docs/configuration.md, "Limits on what peers
// send"), lowered through their knobs: a raw peer sending one frame over
// each fails its channel with an error naming the peer and the knob, and memory
// stays untouched.
TEST(TcpConformance, PeerLimitsFromTheEnvironmentAreEnforced) {
  using namespace rdmaflow::tcp;
  ::setenv("RDMAFLOW_MAX_FRAME_BYTES", "4096", 1);
  ::setenv("RDMAFLOW_MAX_MESSAGE_BYTES", "4096", 1);
  ::setenv("RDMAFLOW_MAX_PEER_QUEUED", "16", 1);
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    if (rank == 0) {
      RawPeerTarget target;
      RF_ASSERT_OK(target.start(kTcp, rank, world, ex));
      const std::pair<int, const char*> cases[] = {{21, "RDMAFLOW_MAX_FRAME_BYTES=4096"},
                                                   {22, "RDMAFLOW_MAX_MESSAGE_BYTES=4096"},
                                                   {23, "RDMAFLOW_MAX_PEER_QUEUED=16"}};
      for (const auto& [claimed, knob] : cases) {
        RF_ASSIGN_OR_FAIL(auto ch, target.accept_failed(claimed));
        const std::string e = ch->error().to_string();
        EXPECT_NE(e.find(knob), std::string::npos) << e;
        EXPECT_NE(e.find("peer rank " + std::to_string(claimed)), std::string::npos) << e;
      }
      EXPECT_EQ(std::memcmp(target.region.p, target.expected.p, target.region.size), 0)
          << "a refused frame changed memory";
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto target, raw_target_of(ex));
    const std::string& addr = target.first;
    const RemoteKey& key = target.second;
    auto attack = [&](int claimed, const std::vector<uint8_t>& bytes) -> int {
      RawConn c;
      RF_ASSERT_OK(c.open(addr));
      RF_ASSERT(c.hello(claimed));
      RF_ASSERT(c.send(bytes.data(), bytes.size()));
      RF_ASSERT(c.eof_within(Millis(10000)));  // the receiver hung up
      return 0;
    };
    auto frame = [](const FrameHeader& h, size_t payload) {
      std::vector<uint8_t> bytes(sizeof(h) + payload, 0x42);
      std::memcpy(bytes.data(), &h, sizeof(h));
      return bytes;
    };
    // A write chunk of 8 KiB, within the grant and the built-in limit, over the knob's.
    FrameHeader w;
    w.type = static_cast<uint8_t>(FrameType::kWrite);
    w.flags = kFlagFirst | kFlagLast;
    w.key_id = key.key_id;
    w.secret = key.secret;
    w.length = w.total = 8192;
    RF_ASSERT(attack(21, frame(w, 8192)) == 0);
    FrameHeader m;
    m.type = static_cast<uint8_t>(FrameType::kMessage);
    m.length = 8192;
    RF_ASSERT(attack(22, frame(m, 8192)) == 0);
    // 1000 reads of the whole 64 KiB grant, never reading a response: the
    // responses queue up on the receiver until the cap fails the channel.
    std::vector<uint8_t> reads;
    for (int i = 0; i < 1000; ++i) {
      FrameHeader q;
      q.type = static_cast<uint8_t>(FrameType::kReadRequest);
      q.op_id = static_cast<uint64_t>(i) + 1;
      q.key_id = key.key_id;
      q.secret = key.secret;
      q.value = key.length;
      auto f = frame(q, 0);
      reads.insert(reads.end(), f.begin(), f.end());
    }
    RF_ASSERT(attack(23, reads) == 0);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  ::unsetenv("RDMAFLOW_MAX_FRAME_BYTES");
  ::unsetenv("RDMAFLOW_MAX_MESSAGE_BYTES");
  ::unsetenv("RDMAFLOW_MAX_PEER_QUEUED");
  RF_EXPECT_RUN_OK(r);
}

// The receive path after a bulk payload (>= 64 KiB) reads a small window, not
// the next header alone: a slot credit between two pieces, the next piece's
// header and the first bytes of its payload come in the read that ends the
// first piece. Three posted writes queued in the socket before the channel
// exists (64 KiB, 8 B, 64 KiB): every byte lands where its frame says, the
// notifies come in order, and the channel reads them in 3 recvmsg (reading
// the header alone took 4).
TEST(TcpConformance, ASmallFrameAfterABulkPayloadComesInTheSameRead) {
  using namespace rdmaflow::tcp;
  constexpr size_t kBulk = 64 << 10;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    if (rank == 0) {
      RawPeerTarget target;
      RF_ASSERT_OK(target.start(kTcp, rank, world, ex));
      RF_ASSERT(target.region.size == kBulk);
      RF_ASSERT_OK(ex.barrier());  // every frame is in the socket
      RF_ASSIGN_OR_FAIL(auto ch, target.node.transport->accept(16, kOpTimeout));
      for (uint64_t want : {1u, 2u, 3u}) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch->inbox().wait_notify(kOpTimeout));
        EXPECT_EQ(v, want);
      }
      fill_pattern(target.expected.p, kBulk, 33);  // the last write's bytes everywhere
      EXPECT_EQ(std::memcmp(target.region.p, target.expected.p, kBulk), 0)
          << "bytes staged with a header landed in the wrong place";
      auto* tcp = dynamic_cast<TcpChannel*>(ch.get());
      RF_ASSERT(tcp != nullptr);
      EXPECT_LE(tcp->receive_calls(), 3u);
      EXPECT_TRUE(ch->error().is_ok()) << ch->error().to_string();
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto target, raw_target_of(ex));
    const RemoteKey& key = target.second;
    RawConn c;
    RF_ASSERT_OK(c.open(target.first));
    RF_ASSERT(c.hello(16));
    std::vector<uint8_t> bytes;
    auto frame = [&](size_t len, uint64_t notify, uint64_t seed) {
      FrameHeader w;
      w.type = static_cast<uint8_t>(FrameType::kWrite);
      w.flags = kFlagFirst | kFlagLast | kFlagHasNotify | kFlagNoAck;
      w.op_id = notify;
      w.key_id = key.key_id;
      w.secret = key.secret;
      w.length = w.total = len;
      w.value = notify;
      const size_t at = bytes.size();
      bytes.resize(at + sizeof(w) + len);
      std::memcpy(bytes.data() + at, &w, sizeof(w));
      fill_pattern(bytes.data() + at + sizeof(w), len, seed);
    };
    frame(kBulk, 1, 22);
    frame(8, 2, 0);
    frame(kBulk, 3, 33);
    RF_ASSERT(c.send(bytes.data(), bytes.size()));
    // send() returning is not arrival: the rest may wait for the receiver's
    // window to open (it failed under ASan with 4 reads for that reason).
    RF_ASSERT(c.drained(kOpTimeout));
    RF_ASSERT_OK(ex.barrier());
    RF_ASSERT_OK(ex.barrier());  // keep the connection until rank 0 checked
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Two tcp ranks connected, each with a 4 KiB region exposed; every rank's key in `keys`.
struct ExposedPair {
  Node node;
  Buffer region{4096};
  std::vector<std::string> keys;

  Status connect(int rank, int world, Exchange& ex) {
    RDMAFLOW_RETURN_IF_ERROR(node.connect_all(kTcp, rank, world, ex));
    RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey key, node.expose(region.p, region.size));
    RDMAFLOW_ASSIGN_OR_RETURN(keys, ex.allgather(key_bytes(key)));
    return Status::ok();
  }
  Channel& peer(int rank) { return *node.peers[static_cast<size_t>(1 - rank)]; }
};

// Writes posted with hold 0 (a rank's slot credits) from inside a driving
// waiter's ready(), the executor's step, leave when ready() returns, with what
// the step posted after them: a credit and the piece after it in one sendmsg
// (two before), and nothing held past the step (no tick is asked for it: if
// the end of the step did not send it, the peer would wait forever).
TEST(TcpConformance, HoldZeroWritesOfAStepLeaveWithItsNextFrame) {
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    ExposedPair pair;
    RF_ASSERT_OK(pair.connect(rank, world, ex));
    Channel& ch = pair.peer(rank);
    Buffer& region = pair.region;
    if (rank == 1) {
      for (uint64_t want : {1u, 2u, 3u}) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
        EXPECT_EQ(v, want);
      }
      EXPECT_EQ(check_pattern(region.p + 64, 64, 5), -1);
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(RemoteKey peer, parse_key(pair.keys[1]));
    auto* tcp = dynamic_cast<tcp::TcpChannel*>(&ch);
    RF_ASSERT(tcp != nullptr);
    auto driver = ch.inbox().wait_driver();
    RF_ASSERT(driver != nullptr);
    Buffer credit(8), piece(64);
    fill_pattern(piece.p, piece.size, 5);
    auto noop = [](const Status&) {};
    const auto deadline = std::chrono::steady_clock::now() + kOpTimeout;
    // A credit, then a piece, in one step.
    uint64_t before = tcp->send_calls();
    bool posted = false;
    RF_ASSERT(driver->drive(
        [&] {
          if (!posted) {
            ch.post_write_deferred(credit.p, 8, peer, 0, 1, noop, kOpTimeout, 0);
            ch.post_write(piece.p, 64, peer, 64, 2, noop, kOpTimeout);
            posted = true;
          }
          return true;
        },
        deadline));
    EXPECT_EQ(tcp->send_calls() - before, 1u);
    // A credit alone: sent when the step ends.
    before = tcp->send_calls();
    RF_ASSERT(driver->drive(
        [&] {
          ch.post_write_deferred(credit.p, 8, peer, 0, 3, noop, kOpTimeout, 0);
          return true;
        },
        deadline));
    EXPECT_EQ(tcp->send_calls() - before, 1u);
    RF_ASSERT_OK(ex.barrier());  // rank 1 took all three
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Landings (Channel::post_landing): a write whose frames arrive after the
// landing was posted goes to its dst whole, the granted memory untouched; one
// that arrived before stays where it was written; a frame that only partly
// lies inside the landing, or arrives after take_landing(), is not moved;
// overlapping landings are refused. Rank 0 writes, rank 1 receives.
TEST(TcpConformance, LandingsPutWritesWhereTheReceiverWantsThem) {
  constexpr size_t kPart = 64 << 10;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(kTcp, rank, world, ex));
    Buffer region(4 * kPart), dst(2 * kPart);
    std::memset(region.p, 0, region.size);
    std::memset(dst.p, 0, dst.size);
    RF_ASSIGN_OR_FAIL(RemoteKey key, node.expose(region.p, region.size));
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(key_bytes(key)));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    auto zero = [](const uint8_t* p, size_t n) {
      return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
    };
    if (rank == 1) {
      auto wait = [&](uint64_t want) {
        auto v = ch.inbox().wait_notify(kOpTimeout);
        return v.is_ok() && v.value() == want;
      };
      // 1. Posted first: the whole write lands at dst.
      RF_ASSERT(ch.post_landing(region.p, kPart, dst.p));
      EXPECT_FALSE(ch.post_landing(region.p + 4096, 4096, dst.p + kPart)) << "overlap";
      RF_ASSERT_OK(ex.barrier());  // A: rank 0 writes [0, kPart)
      RF_ASSERT(wait(1));
      Channel::Landed got = ch.take_landing(region.p);
      RF_ASSERT(got.count == 1);
      EXPECT_EQ(got.ranges[0].offset, 0u);
      EXPECT_EQ(got.ranges[0].len, kPart);
      EXPECT_EQ(check_pattern(dst.p, kPart, 1), -1);
      EXPECT_TRUE(zero(region.p, kPart)) << "a landed write also reached the granted memory";
      // 2. Half before the landing, half after: each frame where it was when it came.
      RF_ASSERT_OK(ex.barrier());  // B: rank 0 writes the first half of [kPart, 2 kPart)
      RF_ASSERT(wait(2));
      RF_ASSERT(ch.post_landing(region.p + kPart, kPart, dst.p + kPart));
      RF_ASSERT_OK(ex.barrier());  // C: the second half
      RF_ASSERT(wait(3));
      got = ch.take_landing(region.p + kPart);
      RF_ASSERT(got.count == 1);
      EXPECT_EQ(got.ranges[0].offset, kPart / 2);
      EXPECT_EQ(got.ranges[0].len, kPart / 2);
      EXPECT_EQ(check_pattern(region.p + kPart, kPart / 2, 2), -1);
      EXPECT_EQ(check_pattern(dst.p + kPart + kPart / 2, kPart / 2, 3), -1);
      EXPECT_TRUE(zero(dst.p + kPart, kPart / 2));
      EXPECT_TRUE(zero(region.p + kPart + kPart / 2, kPart / 2));
      // 3. A frame that runs past the landing's end, and one after its take: not moved.
      std::memset(dst.p, 0, dst.size);
      RF_ASSERT(ch.post_landing(region.p + 2 * kPart, kPart / 2, dst.p));
      RF_ASSERT_OK(ex.barrier());  // D: [2 kPart, 2 kPart + kPart) in one frame
      RF_ASSERT(wait(4));
      EXPECT_EQ(ch.take_landing(region.p + 2 * kPart).count, 0);
      EXPECT_EQ(check_pattern(region.p + 2 * kPart, kPart, 4), -1);
      RF_ASSERT(ch.post_landing(region.p + 3 * kPart, kPart, dst.p));
      EXPECT_EQ(ch.take_landing(region.p + 3 * kPart).count, 0);
      EXPECT_EQ(ch.take_landing(region.p + 3 * kPart).count, 0) << "taken twice";
      RF_ASSERT_OK(ex.barrier());  // E: [3 kPart, 4 kPart)
      RF_ASSERT(wait(5));
      EXPECT_EQ(check_pattern(region.p + 3 * kPart, kPart, 5), -1);
      EXPECT_TRUE(zero(dst.p, dst.size));
      EXPECT_TRUE(ch.error().is_ok()) << ch.error().to_string();
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(RemoteKey peer, parse_key(keys[1]));
    Buffer src(kPart);
    auto write = [&](uint64_t off, size_t len, uint64_t seed, uint64_t notify) {
      fill_pattern(src.p, len, seed);
      RF_ASSERT_OK(write_sync(ch, src.p, len, peer, off, notify, kOpTimeout));
      return 0;
    };
    RF_ASSERT_OK(ex.barrier());  // A
    RF_ASSERT(write(0, kPart, 1, 1) == 0);
    RF_ASSERT_OK(ex.barrier());  // B
    RF_ASSERT(write(kPart, kPart / 2, 2, 2) == 0);
    RF_ASSERT_OK(ex.barrier());  // C
    // The second half's bytes as its own pattern (seed 3 from its first byte).
    RF_ASSERT(write(kPart + kPart / 2, kPart / 2, 3, 3) == 0);
    RF_ASSERT_OK(ex.barrier());  // D
    RF_ASSERT(write(2 * kPart, kPart, 4, 4) == 0);
    RF_ASSERT_OK(ex.barrier());  // E
    RF_ASSERT(write(3 * kPart, kPart, 5, 5) == 0);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Context switches, voluntary and not, of every thread of this process so far.
uint64_t context_switches() {
  uint64_t total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.starts_with("voluntary_ctxt_switches:") ||
          line.starts_with("nonvoluntary_ctxt_switches:")) {
        total += std::stoull(line.substr(line.find(':') + 1));
      }
    }
  }
  return total;
}

// The progress thread's ticker (held credits, deferred ACKs, deadlines) runs
// while something is pending and stops 100 idle ticks later: an idle
// transport sleeps. It used to tick every millisecond for good once started.
TEST(TcpConformance, AnIdleTransportStopsTicking) {
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    ExposedPair pair;
    RF_ASSERT_OK(pair.connect(rank, world, ex));
    Channel& ch = pair.peer(rank);
    Buffer& region = pair.region;
    if (rank == 0) {  // some traffic first: it starts the ticker
      RF_ASSIGN_OR_FAIL(RemoteKey peer, parse_key(pair.keys[1]));
      Buffer src(64);
      fill_pattern(src.p, src.size, 7);
      RF_ASSERT_OK(write_sync(ch, src.p, src.size, peer, 0, 7));
    } else {
      RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 7u);
      EXPECT_EQ(check_pattern(region.p, 64, 7), -1);
    }
    RF_ASSERT_OK(ex.barrier());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past the idle ticks
    const uint64_t before = context_switches();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const uint64_t switches = context_switches() - before;
    // A ticker still running would switch about 500 times in this half second.
    EXPECT_LT(switches, 50u) << "rank " << rank << ": the idle process kept waking up";
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
