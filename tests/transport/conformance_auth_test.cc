// The channel contract's trust rows, for every backend (the fixture and rows of
// conformance_test.cc; docs/security.md): a peer without the job secret, or with
// a wrong one, never gets a channel and writes nothing; a write or read that
// presents a forged key secret fails its channel on both sides instead of being
// answered, and writes nothing.
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/transport/conformance_util.h"

namespace rdmaflow::testing {
namespace {

constexpr const char* kJobSecret = "conformance-job-secret-0123456789";
constexpr size_t kRegion = 64 << 10;

// The per-user host secret goes to a scratch directory, not the user's own.
void use_scratch_host_secret(int rank) {
  const std::string dir =
      "/tmp/rdmaflow-auth-conf-" + std::to_string(::getpid()) + "-" + std::to_string(rank);
  ::mkdir(dir.c_str(), 0700);
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
}

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Rank 0 listens with a zeroed region granted; rank 2 tries to connect without the
// job secret, then with a wrong one (each time with the genuine key in hand); only
// then rank 1, with the secret, connects and writes.
TEST_P(Conformance, PeersWithoutTheJobSecretAreRefusedAndWriteNothing) {
  auto r = run_ranks(3, [&](int rank, int world, Exchange& ex) {
    use_scratch_host_secret(rank);
    ::setenv("RDMAFLOW_JOB_SECRET", kJobSecret, 1);
    Node node;
    RF_ASSERT_OK(node.create(backend(), rank, world, ex));  // a backend not viable: all skip
    if (rank == 0) {
      RF_ASSIGN_OR_FAIL(std::string addr, node.transport->listen());
      Buffer region(kRegion);
      std::memset(region.p, 0, region.size);
      RF_ASSIGN_OR_FAIL(RemoteKey key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(join2(addr, key_bytes(key))));
      RF_ASSERT_OK(ex.barrier());  // rank 2 gave up
      auto stray = node.transport->accept(2, Millis(200));
      EXPECT_FALSE(stray.is_ok()) << "a peer without the job secret got a channel";
      EXPECT_TRUE(all_zero(region.p, region.size)) << "an unauthenticated peer wrote memory";
      RF_ASSERT_OK(ex.barrier());  // rank 1 may connect
      RF_ASSIGN_OR_FAIL(auto ch, node.transport->accept(1, kOpTimeout));
      RF_ASSIGN_OR_FAIL(uint64_t v, ch->inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 5u);
      EXPECT_EQ(check_pattern(region.p, 4096, 3), -1);
      EXPECT_TRUE(all_zero(region.p + 4096, region.size - 4096));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    auto [addr, key_text] = split2(all[0]);
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(key_text));
    Buffer src(4096);
    fill_pattern(src.p, src.size, 3);
    if (rank == 2) {
      for (const char* secret : {"", "a-wrong-secret-of-another-job"}) {
        if (*secret == '\0') {
          ::unsetenv("RDMAFLOW_JOB_SECRET");  // the per-user host secret: not the job's
        } else {
          ::setenv("RDMAFLOW_JOB_SECRET", secret, 1);
        }
        Node attacker;
        RF_ASSERT_OK(attacker.create(backend(), rank, world, ex));
        RF_ASSERT_OK(attacker.local(src));
        auto ch = attacker.transport->connect(0, addr, Millis(5000));
        EXPECT_FALSE(ch.is_ok()) << "connected with secret '" << secret << "'";
        if (!ch.is_ok()) {
          EXPECT_EQ(ch.status().code(), Code::kUnauthenticated) << ch.status().to_string();
          continue;
        }
        // Had it connected, this write is what the region check would catch.
        (void)write_sync(**ch, src.p, src.size, key, 0, 1, Millis(2000));
      }
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSERT_OK(node.local(src));
    RF_ASSERT_OK(ex.barrier());
    RF_ASSERT_OK(ex.barrier());
    RF_ASSIGN_OR_FAIL(auto ch, node.transport->connect(0, addr, kOpTimeout));
    RF_ASSERT_OK(write_sync(*ch, src.p, src.size, key, 0, 5));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A peer that sends a message over the receiver's RDMAFLOW_MAX_MESSAGE_BYTES (a
// hostile peer, or one configured otherwise: its own limit lets it send) fails
// the receiver's channel with an error naming the limit and the peer, before a
// buffer of that size is allocated: on ucx both the eager path (8 KiB) and the
// announced (rendezvous) one (1 MiB), on tcp the MESSAGE frame's header check, on
// verbs the reassembler of its fragments.
TEST_P(Conformance, AMessageOverTheReceiversLimitFailsItsChannel) {
  for (const size_t size : {size_t{8192}, size_t{1} << 20}) {
    SCOPED_TRACE(std::to_string(size) + " bytes");
    auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
      if (rank == 0) ::setenv("RDMAFLOW_MAX_MESSAGE_BYTES", "4096", 1);
      Node node;
      RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
      RF_ASSERT_OK(ex.barrier());  // both ends set up: what fails next is the message
      Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto within, ch.inbox().recv_message(kOpTimeout));
        EXPECT_EQ(within.size(), 4096u);  // the limit itself is allowed
        auto over = ch.inbox().recv_message(kOpTimeout);
        RF_ASSERT(!over.is_ok());
        EXPECT_NE(over.status().reason().find("RDMAFLOW_MAX_MESSAGE_BYTES=4096"), std::string::npos)
            << over.status().to_string();
        EXPECT_EQ(over.status().peer(), 1) << over.status().to_string();
        RF_ASSERT_OK(ex.barrier());
        return 0;
      }
      Completion a, b;
      ch.send_message(std::vector<uint8_t>(4096, 1), a.callback(), kOpTimeout);
      RF_ASSERT_OK(a.wait(kOpTimeout));
      ch.send_message(std::vector<uint8_t>(size, 2), b.callback(), kOpTimeout);
      (void)b.wait(kOpTimeout);  // it may complete (handed over) or fail (the peer hung up)
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    RF_EXPECT_RUN_OK(r);
  }
}

// A forged secret is no question the target answers: the channel that carried it
// fails on both sides (sticky), and the target's memory is untouched.
TEST_P(Conformance, AForgedKeySecretFailsTheChannel) {
  for (const bool is_write : {true, false}) {
    SCOPED_TRACE(is_write ? "write" : "read");
    auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
      Node node;
      RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
      Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
      if (rank == 1) {
        Buffer region(kRegion);
        fill_pattern(region.p, region.size, 77);
        const uint64_t before = checksum(region.p, region.size);
        RF_ASSIGN_OR_FAIL(RemoteKey key, node.expose(region.p, region.size));
        RF_ASSERT_OK(ex.allgather(key_bytes(key)));
        RF_ASSERT_OK(ex.barrier());  // rank 0 presented the forgery
        // The target's side failed too, naming the forger.
        const auto deadline = std::chrono::steady_clock::now() + Millis(10000);
        while (ch.error().is_ok() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(Millis(5));
        }
        EXPECT_EQ(ch.error().code(), Code::kUnauthenticated) << ch.error().to_string();
        EXPECT_EQ(ch.error().peer(), 0) << ch.error().to_string();
        EXPECT_EQ(checksum(region.p, region.size), before) << "a forged key changed memory";
        RF_ASSERT_OK(ex.barrier());
        return 0;
      }
      RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
      RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(all[1]));
      Buffer buf(4096);
      RF_ASSERT_OK(node.local(buf));
      fill_pattern(buf.p, buf.size, 5);
      RemoteKey forged = key;
      forged.secret.hi ^= 1;  // 127 of 128 bits right is still wrong
      Status st = is_write ? write_sync(ch, buf.p, buf.size, forged, 0, 1, Millis(5000))
                           : read_sync(ch, buf.p, buf.size, forged, 0, Millis(5000));
      EXPECT_FALSE(st.is_ok()) << "an access with a forged secret succeeded";
      EXPECT_NE(st.code(), Code::kTimeout) << st.to_string();
      // Sticky: the genuine key does not revive the channel.
      Status after = write_sync(ch, buf.p, buf.size, key, 0, 2, Millis(5000));
      EXPECT_FALSE(after.is_ok()) << "the channel survived a forged secret";
      EXPECT_FALSE(ch.error().is_ok());
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    RF_EXPECT_RUN_OK(r);
  }
}

}  // namespace
}  // namespace rdmaflow::testing
