// The channel contract under failure, for every backend (the rows and the
// fixture of conformance_test.cc): revoke fences, a peer killed mid-transfer,
// nobody listening, timeouts, close and shutdown.
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "tests/transport/conformance_util.h"

namespace rdmaflow::testing {
namespace {

// The revoke-fence tests. Rank 1 grants a kFenceBytes region holding kFenceFill and
// revokes the key while rank 0 keeps kFenceInFlight operations streaming through
// it; the moment revoke_key() returns it protects the region with `prot`, so a
// late access faults (a socket read or send with it fails with EFAULT and breaks
// the channel, a copy crashes the rank). Rank 0's stream must end with an error,
// which `end_error` checks; `owner_error` then checks rank 1's channel. (On verbs the revoke is not
// a fence, see transport.h, and mprotect() does not stop DMA: there only the end of the stream is
// checked.)
constexpr size_t kFenceBytes = 16 << 20;
constexpr int kFenceInFlight = 4;
constexpr uint8_t kFenceFill = 0x5A;
struct FenceStream {
  std::function<void(int slot, Callback done)> start;  // one operation, slot < kFenceInFlight
  std::function<void(int slot)> landed;                // checks one that succeeded
};
using MakeFenceStream = std::function<FenceStream(Node&, Channel&, const RemoteKey&)>;

using CheckStatus = std::function<void(const Status&)>;

RunResult run_revoke_fence(const BackendRow& backend, int prot, const CheckStatus& end_error,
                           const CheckStatus& owner_error, const MakeFenceStream& make) {
  return run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend, rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(kFenceBytes);  // whole pages (aligned_alloc), so mprotect() may cover it
      std::memset(region.p, kFenceFill, region.size);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      RF_ASSERT_OK(ex.barrier());  // the stream is running
      std::this_thread::sleep_for(Millis(30));
      RF_ASSERT_OK(node.transport->revoke_key(key));
      RF_ASSERT(::mprotect(region.p, region.size, prot) == 0);
      RF_ASSERT_OK(ex.barrier(Millis(30000)));  // the stream ended and drained
      owner_error(ch.error());
      RF_ASSERT(::mprotect(region.p, region.size, PROT_READ | PROT_WRITE) == 0);
      RF_ASSERT_OK(ex.barrier());  // rank 0's channel stays up until this check
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(all[1]));
    FenceStream stream = make(node, ch, key);
    std::deque<std::pair<Completion, int>> flying;
    int next = 0;
    auto post = [&] {
      flying.emplace_back();
      flying.back().second = next++ % kFenceInFlight;
      stream.start(flying.back().second, flying.back().first.callback());
    };
    for (int i = 0; i < kFenceInFlight; ++i) post();
    RF_ASSERT_OK(ex.barrier());
    Status ended;
    const auto give_up = std::chrono::steady_clock::now() + Millis(20000);
    while (!flying.empty()) {
      const int slot = flying.front().second;
      Status st = flying.front().first.wait(kOpTimeout + Millis(2000));
      flying.pop_front();
      if (st.is_ok()) {
        stream.landed(slot);
      } else if (ended.is_ok()) {
        ended = st;
      }
      if (ended.is_ok() && std::chrono::steady_clock::now() < give_up) post();
    }
    EXPECT_FALSE(ended.is_ok()) << "operations with the revoked key kept succeeding";
    if (!ended.is_ok()) end_error(ended);
    RF_ASSERT_OK(ex.barrier(Millis(30000)));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
}

// Once revoke_key() returns no write with the key lands, not even the rest of one
// that was arriving (TCP places a chunk over many socket reads; UCX waits for the
// writer to drop the key): the region goes read-only, the writes end refused, and
// the channel stays healthy.
// On verbs with grant windows (RDMAFLOW_IB_GRANT_PROTECTION; the default where
// the device has type 2 windows) the revoke is a fence at the NIC: a write still
// in flight meets a deallocated window and the queue pair breaks on both sides
// (kPeerFailed), as a dead rkey does.
TEST_P(Conformance, RevokeFencesWritesInFlight) {
  const bool verbs = std::string(backend().label) == "verbs";
  auto r = run_revoke_fence(
      backend(), PROT_READ,
      [verbs](const Status& st) {
        EXPECT_TRUE(st.code() == Code::kNotFound || (verbs && st.code() == Code::kPeerFailed))
            << st.to_string();
      },
      [verbs](const Status& st) {
        EXPECT_TRUE(st.is_ok() || (verbs && st.code() == Code::kPeerFailed)) << st.to_string();
      },
      [](Node& node, Channel& ch, const RemoteKey& key) {
        auto src = std::make_shared<Buffer>(kFenceBytes);
        EXPECT_TRUE(node.local(*src).is_ok());
        std::memset(src->p, 0x11, src->size);
        return FenceStream{[&ch, key, src](int, Callback done) {
                             ch.write(src->p, kFenceBytes, key, 0, std::nullopt, std::move(done),
                                      kOpTimeout);
                           },
                           [](int) {}};
      });
  RF_EXPECT_RUN_OK(r);
}

// The same for reads: once revoke_key() returns the owner sends no byte of the
// region, not even the rest of a read being answered; the region goes unreadable.
// A TCP owner caught mid-chunk cannot resume the stream and fails its channel with
// kNotFound naming the key (as a verbs queue pair breaks on a dead rkey); it must
// never read the region after the revoke. A read that succeeded has the owner's bytes.
TEST_P(Conformance, RevokeFencesReadsBeingServed) {
  auto r = run_revoke_fence(
      backend(), PROT_NONE,
      [](const Status& st) {  // refused, or the owner's broken stream
        EXPECT_TRUE(st.code() == Code::kNotFound || st.code() == Code::kPeerFailed)
            << st.to_string();
      },
      [verbs = std::string(backend().label) == "verbs"](const Status& st) {
        // verbs with grant windows: the owner's queue pair broke on the dead window
        // (rdma_rxe's responder stops the read there; the reader's retries run out
        // in about half a second: kRetryCount in verbs_transport.cc).
        EXPECT_TRUE(st.is_ok() || st.code() == Code::kNotFound ||
                    (verbs && st.code() == Code::kPeerFailed))
            << st.to_string();
      },
      [](Node& node, Channel& ch, const RemoteKey& key) {
        auto dst = std::make_shared<std::vector<std::unique_ptr<Buffer>>>();
        for (int i = 0; i < kFenceInFlight; ++i) {
          dst->push_back(std::make_unique<Buffer>(kFenceBytes));
          EXPECT_TRUE(node.local(*dst->back()).is_ok());
        }
        return FenceStream{[&ch, key, dst](int slot, Callback done) {
                             ch.read((*dst)[static_cast<size_t>(slot)]->p, kFenceBytes, key, 0,
                                     std::move(done), kOpTimeout);
                           },
                           [dst](int slot) {
                             const uint8_t* p = (*dst)[static_cast<size_t>(slot)]->p;
                             EXPECT_TRUE(p[0] == kFenceFill && p[kFenceBytes / 2] == kFenceFill &&
                                         p[kFenceBytes - 1] == kFenceFill)
                                 << "a read that succeeded returned bytes the owner never had";
                           }};
      });
  RF_EXPECT_RUN_OK(r);
}

// Deregistering memory revokes every key granted from it, as revoke_key() does,
// for peers that already used a key too: once deregister_memory() returns, no
// write with those keys lands (verbs: see the revoke-fence tests; there the channel
// may break instead of refusing). The same memory then registers and grants afresh.
TEST_P(Conformance, DeregisterRevokesTheKeysOfTheRegion) {
  constexpr size_t kBytes = 64 << 10;
  const bool refuses = std::string(backend().label) != "verbs";
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(kBytes);
      std::memset(region.p, 0, region.size);
      RF_ASSIGN_OR_FAIL(RegionId id, node.transport->register_memory(region.p, region.size));
      RF_ASSIGN_OR_FAIL(RemoteKey key, node.transport->export_key(region.p, region.size));
      RF_ASSIGN_OR_FAIL(RemoteKey part, node.transport->export_key(region.p + 4096, 4096));
      RF_ASSERT_OK(ex.allgather(join2(key_bytes(key), key_bytes(part))));
      RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 1u);
      EXPECT_EQ(check_pattern(region.p, kBytes, 5), -1);
      RF_ASSERT_OK(node.transport->deregister_memory(id));
      EXPECT_EQ(node.transport->deregister_memory(id).code(), Code::kNotFound);
      EXPECT_EQ(node.transport->revoke_key(part).code(), Code::kNotFound);
      EXPECT_FALSE(node.transport->export_key(region.p, 8).is_ok());
      std::memset(region.p, 0, region.size);
      RF_ASSERT_OK(ex.barrier());  // deregistered: rank 0 tries the old keys
      RF_ASSIGN_OR_FAIL(auto up, ex.allgather(""));
      for (size_t i = 0; i < kBytes; ++i) RF_ASSERT(region.p[i] == 0);
      // Registered again, granted afresh, written through a live channel.
      RF_ASSIGN_OR_FAIL(RegionId again, node.transport->register_memory(region.p, region.size));
      RF_ASSIGN_OR_FAIL(RemoteKey fresh, node.transport->export_key(region.p, region.size));
      EXPECT_NE(fresh.key_id, key.key_id);
      RF_ASSERT_OK(ex.allgather(key_bytes(fresh)));
      if (up[0] == "up") {
        RF_ASSIGN_OR_FAIL(uint64_t w, ch.inbox().wait_notify(kOpTimeout));
        EXPECT_EQ(w, 2u);
        EXPECT_EQ(check_pattern(region.p, kBytes, 6), -1);
      }
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(node.transport->deregister_memory(again));
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    auto [key_text, part_text] = split2(all[1]);
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(key_text));
    RF_ASSIGN_OR_FAIL(RemoteKey part, parse_key(part_text));
    Buffer src(kBytes);
    RF_ASSERT_OK(node.local(src));
    fill_pattern(src.p, kBytes, 5);
    RF_ASSERT_OK(write_sync(ch, src.p, kBytes, key, 0, uint64_t{1}));  // the key is in use
    RF_ASSERT_OK(ex.barrier());
    fill_pattern(src.p, kBytes, 6);
    for (size_t len : {kBytes, size_t{8}}) {  // the paths of large and of small writes
      Status st = write_sync(ch, src.p, len, key, 0, std::nullopt);
      EXPECT_FALSE(st.is_ok()) << len << "-byte write with a deregistered key was accepted";
      if (refuses) {
        EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
      }
    }
    Status st = write_sync(ch, src.p, 8, part, 0, std::nullopt);
    EXPECT_FALSE(st.is_ok()) << "write with a deregistered key was accepted";
    if (refuses) {
      EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
    }
    const bool up = ch.error().is_ok();
    EXPECT_TRUE(up || !refuses) << ch.error().to_string();
    RF_ASSERT_OK(ex.allgather(up ? "up" : "down"));
    RF_ASSIGN_OR_FAIL(auto fresh_all, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey fresh, parse_key(fresh_all[1]));
    if (up) RF_ASSERT_OK(write_sync(ch, src.p, kBytes, fresh, 0, uint64_t{2}));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ---------------------------------------------------------------- failures

TEST_P(Conformance, PeerKilledMidTransferFailsPendingOperationsNamingIt) {
  constexpr size_t kBytes = 32 << 20;
  constexpr int kWrites = 128;  // 4 GiB: still in flight when the peer dies
  constexpr Millis kTimeout(8000);
  RunOptions o = opts();
  o.may_be_killed = {1};
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          Buffer region(kBytes);
          RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
          RF_ASSERT_OK(ex.allgather(key_bytes(key)));
          for (;;) ::pause();  // killed by rank 0
        }
        RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
        RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(all[1]));
        Buffer src(kBytes), dst(kBytes);
        RF_ASSERT_OK(node.local(src));
        RF_ASSERT_OK(node.local(dst));
        std::memset(src.p, 1, kBytes);
        struct Tally {
          std::mutex mu;
          std::vector<Status> failures;
          int ok = 0;
          int calls = 0;
        };
        auto tally = std::make_shared<Tally>();
        auto record = [tally](const Status& st) {
          std::lock_guard<std::mutex> lock(tally->mu);
          ++tally->calls;
          if (st.is_ok()) {
            ++tally->ok;
          } else {
            tally->failures.push_back(st);
          }
        };
        CompletionGroup group;
        auto both = [&]() {
          Callback g = group.add();
          return [g, record](const Status& st) {
            record(st);
            g(st);
          };
        };
        // The key is in use before the transfer starts, and the kill goes out from
        // another thread once the first write is posted: a same-host UCX channel copies
        // on the issuing thread, so the peer dies while its memory is being written.
        RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 0, std::nullopt));
        ch.write(src.p, kBytes, key, 0, 0, both(), kTimeout);
        auto killed_at = std::chrono::steady_clock::now();
        Status killed;
        std::thread killer([&] { killed = ex.kill(1); });
        for (int i = 1; i < kWrites; ++i) {
          ch.write(src.p, kBytes, key, 0, static_cast<uint64_t>(i), both(), kTimeout);
        }
        ch.read(dst.p, kBytes, key, 0, both(), kTimeout);
        ch.send_message(std::vector<uint8_t>(16), both(), kTimeout);
        killer.join();
        RF_ASSERT_OK(killed);
        group.wait(kTimeout + Millis(5000)).is_ok();  // errors expected
        auto elapsed = std::chrono::steady_clock::now() - killed_at;
        EXPECT_LT(elapsed, kTimeout) << "pending operations did not fail within the timeout";
        std::lock_guard<std::mutex> lock(tally->mu);
        EXPECT_EQ(tally->calls, kWrites + 2);
        // At most the read and the message may fail alone; some write must fail too.
        EXPECT_LT(tally->ok, kWrites) << "no write failed: the peer's death went unnoticed while "
                                      << tally->ok << " of " << kWrites + 2 << " operations ran";
        for (const Status& st : tally->failures) {
          EXPECT_TRUE(st.code() == Code::kPeerFailed || st.code() == Code::kTimeout)
              << st.to_string();
          EXPECT_EQ(st.peer(), 1) << st.to_string();
          EXPECT_NE(st.to_string().find("rank 1"), std::string::npos) << st.to_string();
        }
        // Sticky: the channel and its inbox report the failure; new operations fail at once.
        EXPECT_FALSE(ch.error().is_ok());
        auto n = ch.inbox().wait_notify(Millis(2000));
        // Notifies that arrived before the death may be drained first.
        while (n.is_ok()) n = ch.inbox().wait_notify(Millis(2000));
        EXPECT_NE(n.status().code(), Code::kTimeout) << n.status().to_string();
        auto t0 = std::chrono::steady_clock::now();
        Status late = write_sync(ch, src.p, 10, key, 0, std::nullopt);
        EXPECT_FALSE(late.is_ok());
        EXPECT_EQ(late.peer(), 1) << late.to_string();
        EXPECT_LT(std::chrono::steady_clock::now() - t0, Millis(1000));
        return 0;
      },
      o);
  RF_EXPECT_RUN_OK(r);
}

TEST_P(Conformance, ConnectingWhereNobodyListensFailsWithinTheTimeout) {
  auto r = run_ranks(1, [&](int rank, int world, Exchange& ex) {
    // An address that was valid a moment ago: its transport is gone.
    std::string dead;
    {
      Node gone;
      RF_ASSERT_OK(gone.create(backend(), 1, 2, ex));
      RF_ASSIGN_OR_FAIL(dead, gone.transport->listen());
    }
    Node node;
    RF_ASSERT_OK(node.create(backend(), rank, world, ex));
    constexpr Millis kTimeout(300);
    auto t0 = std::chrono::steady_clock::now();
    auto ch = node.transport->connect(1, dead, kTimeout);
    auto elapsed = std::chrono::steady_clock::now() - t0;
    RF_ASSERT(!ch.is_ok());
    EXPECT_TRUE(ch.status().code() == Code::kConnectionFailed ||
                ch.status().code() == Code::kTimeout)
        << ch.status().to_string();
    EXPECT_EQ(ch.status().peer(), 1) << ch.status().to_string();
    EXPECT_LT(elapsed, kTimeout + Millis(1000)) << "connect overran its timeout";
    // accept() of a rank that never connects times out too.
    auto a = node.transport->accept(5, Millis(200));
    RF_ASSERT(!a.is_ok());
    EXPECT_EQ(a.status().code(), Code::kTimeout) << a.status().to_string();
    EXPECT_EQ(a.status().peer(), 5);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST_P(Conformance, TimedOutOperationsCompleteAndTheChannelRecovers) {
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(1 << 20);
      fill_pattern(region.p, region.size, 3);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      RF_ASSERT_OK(ex.barrier(Millis(30000)));  // stopped and resumed by rank 0 meanwhile
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(all[1]));
    Buffer dst(1 << 20), same(64);
    RF_ASSERT_OK(node.local(dst));
    RF_ASSERT_OK(node.local(same));
    fill_pattern(same.p, 64, 3);  // the timed-out write still lands later: keep it harmless
    RF_ASSERT_OK(ex.signal(1, SIGSTOP));
    constexpr Millis kShort(300);
    auto t0 = std::chrono::steady_clock::now();
    Completion rd, wr;
    ch.read(dst.p, 1 << 20, key, 0, rd.callback(), kShort);
    ch.write(same.p, 64, key, 0, 1, wr.callback(), kShort);
    Status rs = rd.wait(Millis(5000));
    Status ws = wr.wait(Millis(5000));
    auto elapsed = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(rs.code(), Code::kTimeout) << rs.to_string();
    EXPECT_EQ(ws.code(), Code::kTimeout) << ws.to_string();
    EXPECT_EQ(rs.peer(), 1);
    // One wording for every backend (transport/common/op_table.h, timeout_status).
    EXPECT_EQ(rs.reason().rfind("not completed within 300 ms", 0), 0u) << rs.to_string();
    EXPECT_EQ(ws.reason().rfind("not completed within 300 ms", 0), 0u) << ws.to_string();
    EXPECT_GE(elapsed, kShort);
    EXPECT_LT(elapsed, kShort + Millis(700));
    RF_ASSERT_OK(ex.signal(1, SIGCONT));
    // The late answers are dropped; the channel keeps working.
    std::memset(dst.p, 0, dst.size);
    RF_ASSERT_OK(read_sync(ch, dst.p, 1 << 20, key, 0));
    EXPECT_EQ(check_pattern(dst.p, 1 << 20, 3), -1);
    EXPECT_TRUE(ch.error().is_ok()) << ch.error().to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST_P(Conformance, CloseAndShutdownCompleteEveryPendingOperationOnce) {
  constexpr size_t kBytes = 16 << 20;
  constexpr int kWrites = 32;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    Buffer region(kBytes);
    RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(key_bytes(key)));
    RF_ASSIGN_OR_FAIL(RemoteKey peer_key, parse_key(all[static_cast<size_t>(1 - rank)]));
    if (rank == 1) {
      // The peer closes: this side's channel fails, naming rank 0.
      auto n = ch.inbox().wait_notify(kOpTimeout);
      while (n.is_ok()) n = ch.inbox().wait_notify(kOpTimeout);
      EXPECT_NE(n.status().code(), Code::kTimeout) << n.status().to_string();
      EXPECT_EQ(n.status().peer(), 0) << n.status().to_string();
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    OnceChecker once;
    std::atomic<int> calls{0}, cancelled{0};
    auto cb = [&](const Status& st) {
      ++calls;
      if (st.code() == Code::kCancelled) ++cancelled;
    };
    // A stopped peer answers nothing, so the writes are still pending when close()
    // runs (on UCX shared memory a write with notify otherwise completes as soon as
    // its bytes are copied and its notify is in the peer's ring, which can beat close).
    RF_ASSERT_OK(ex.signal(1, SIGSTOP));
    for (int i = 0; i < kWrites; ++i) {
      ch.write(region.p, kBytes, peer_key, 0, static_cast<uint64_t>(i), once.wrap(cb), kOpTimeout);
    }
    ch.close();
    // close() returns once the pending operations have completed.
    for (int spin = 0; spin < 200 && calls.load() < kWrites; ++spin) {
      std::this_thread::sleep_for(Millis(5));
    }
    EXPECT_EQ(calls.load(), kWrites);
    EXPECT_GT(cancelled.load(), 0);
    RF_ASSERT_OK(ex.signal(1, SIGCONT));
    Status after = write_sync(ch, region.p, 8, peer_key, 0, std::nullopt);
    EXPECT_EQ(after.code(), Code::kCancelled) << after.to_string();
    RF_ASSERT_OK(ex.barrier());

    // Shutdown with operations pending on a fresh transport: every callback fires
    // exactly once before shutdown() returns, none after.
    {
      Node second;
      RF_ASSERT_OK(second.create(backend(), rank, world, ex));
      std::string addr;
      RF_ASSIGN_OR_FAIL(addr, second.transport->listen());
      RF_ASSIGN_OR_FAIL(auto loop, second.transport->connect(0, addr, kOpTimeout));
      RF_ASSIGN_OR_FAIL(auto server, second.transport->accept(0, kOpTimeout));
      Buffer target(kBytes);
      RF_ASSIGN_OR_FAIL(auto tkey, second.expose(target.p, target.size));
      RF_ASSERT_OK(second.transport->register_memory(region.p, region.size).status());
      std::atomic<int> n{0};
      for (int i = 0; i < kWrites; ++i) {
        loop->write(region.p, kBytes, tkey, 0, std::nullopt, once.wrap([&](const Status&) { ++n; }),
                    kOpTimeout);
      }
      second.transport->shutdown();
      EXPECT_EQ(n.load(), kWrites);
      std::this_thread::sleep_for(Millis(50));
      EXPECT_EQ(n.load(), kWrites);
    }
    EXPECT_EQ(once.twice.load(), 0);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
