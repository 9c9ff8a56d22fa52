// Memory channels (transport/shm/memory_channel.h) between two real processes
// over a UCX channel on shared memory: put + signal reach the peer's memory
// and wake its wait (also from a sleep on its doorbell), a put or signal
// outside the grant is refused and writes nothing, and a pair where one side
// cannot map (or does not offer) keeps its Channel on both sides, in step. A
// wait ends at its deadline even when its spin is longer.
// Over tcp nothing maps.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_util.h"
#include "transport/shm/memory_channel.h"

namespace rdmaflow::testing {
namespace {

using shm::MemoryChannel;
using shm::MemoryEndpoint;
using shm::MemoryPeer;
using Clock = std::chrono::steady_clock;

constexpr size_t kPage = 4096;
constexpr size_t kBlock = 16 * kPage;  // registered: guard page | grant | ... | doorbell page
constexpr size_t kGrant = 8 * kPage;   // the part of the block the peer puts into
constexpr size_t kWord = kGrant - 8;   // the word the peer signals
constexpr size_t kBell = 12 * kPage;   // this rank's doorbell
constexpr uint8_t kGuard = 0xA5;       // outside the grant: must never change

RunOptions opts() {
  RunOptions o;
  o.timeout = Millis(60000);
  return o;
}

// One rank of a pair: a registered block, a grant in it for the peer, and
// after connect() the memory channel to the peer (or none).
struct Side {
  Node node;
  Buffer block{kBlock};
  int rank = 0;
  size_t grant_at = kPage;
  size_t grant_len = kGrant;
  RemoteKey peer_key;
  std::unique_ptr<MemoryEndpoint> endpoint;
  std::vector<MemoryChannel> channels;

  Channel& channel() { return *node.peers[static_cast<size_t>(1 - rank)]; }
  MemoryChannel& memory() { return channels[static_cast<size_t>(1 - rank)]; }
  std::byte* local() { return reinterpret_cast<std::byte*>(block.p + grant_at); }

  // Registers the block from `register_at` on and swaps grants with the peer.
  Status start(const BackendRow& b, int r, Exchange& ex, size_t register_at = 0) {
    rank = r;
    std::memset(block.p, kGuard, block.size);
    std::memset(block.p + grant_at, 0, grant_len);
    std::memset(block.p + kBell, 0, Doorbell::kBytes);
    RDMAFLOW_RETURN_IF_ERROR(node.connect_all(b, rank, 2, ex));
    RDMAFLOW_RETURN_IF_ERROR(
        node.transport->register_memory(block.p + register_at, kBlock - register_at).status());
    RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey mine,
                              node.transport->export_key(block.p + grant_at, grant_len));
    RDMAFLOW_ASSIGN_OR_RETURN(auto keys, ex.allgather(key_bytes(mine)));
    RDMAFLOW_ASSIGN_OR_RETURN(peer_key, parse_key(keys[static_cast<size_t>(1 - rank)]));
    return Status::ok();
  }

  // start() over ucx_shm, then connect(): a pair that must get its channel.
  Status start_connected(int r, Exchange& ex) {
    RDMAFLOW_RETURN_IF_ERROR(start(backend_row("ucx_shm"), r, ex));
    RDMAFLOW_RETURN_IF_ERROR(connect());
    if (!memory().connected()) {
      return RDMAFLOW_ERROR(Code::kInternal, "connect memory channel", 1 - r, "not connected");
    }
    return Status::ok();
  }

  Status connect(bool offer = true) {
    endpoint = std::make_unique<MemoryEndpoint>(reinterpret_cast<std::byte*>(block.p + kBell));
    std::vector<MemoryPeer> peers(2);
    peers[static_cast<size_t>(1 - rank)] = {&channel(), node.transport.get(), peer_key,
                                            std::span<std::byte>(local(), grant_len)};
    RDMAFLOW_ASSIGN_OR_RETURN(channels, endpoint->connect_all(peers, offer, kOpTimeout));
    return Status::ok();
  }

  // True when every byte of the block outside the grant and the doorbell
  // still holds the guard.
  bool guards_intact() const {
    for (size_t i = 0; i < kBlock; ++i) {
      const bool granted = i >= grant_at && i < grant_at + grant_len;
      const bool bell = i >= kBell && i < kBell + Doorbell::kBytes;
      if (!granted && !bell && block.p[i] != kGuard) return false;
    }
    return true;
  }
};

// Ping-pong of patterns of many sizes: each round one side puts and
// signals, the other waits for the word and then finds every byte there.
TEST(MemoryChannel, PutAndSignalReachTheWaitingPeer) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start(backend_row("ucx_shm"), rank, ex));
        RF_ASSERT_OK(s.connect());
        MemoryChannel& mc = s.memory();
        RF_ASSERT(mc.connected());
        RF_ASSERT(mc.peer_rank() == 1 - rank);
        RF_ASSERT(mc.memory().length() == kGrant);
        Buffer src(kGrant);
        const size_t sizes[] = {1, 8, 63, 4096, 5000, kWord};
        for (uint64_t round = 1; round <= 300; ++round) {
          const size_t n = sizes[round % std::size(sizes)];
          if ((round % 2 == 1) == (rank == 0)) {
            fill_pattern(src.p, n, round);
            RF_ASSERT_OK(mc.put(0, src.p, n));
            RF_ASSERT_OK(mc.signal(kWord, round));
          } else {
            const std::byte* word = s.local() + kWord;
            RF_ASSERT(s.endpoint->wait([&] { return shm::load_word(word) == round; },
                                       Clock::now() + kOpTimeout));
            RF_ASSERT(check_pattern(reinterpret_cast<uint8_t*>(s.local()), n, round) == -1);
          }
        }
        RF_ASSERT(s.guards_intact());
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// The receiver waits with a short spin and sleeps that only the deadline
// would end: the signal's ring of its doorbell is what wakes it.
TEST(MemoryChannel, SignalWakesASleepingWaiter) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start(backend_row("ucx_shm"), rank, ex));
        RF_ASSERT_OK(s.connect());
        RF_ASSERT(s.memory().connected());
        RF_ASSERT_OK(ex.barrier());
        if (rank == 0) {
          std::this_thread::sleep_for(Millis(200));  // the peer is asleep by now
          RF_ASSERT_OK(s.memory().signal(kWord, 42));
        } else {
          shm::PollOptions o;
          o.spin = std::chrono::microseconds(100);
          o.recheck = std::chrono::seconds(600);
          const std::byte* word = s.local() + kWord;
          const auto t0 = Clock::now();
          const auto deadline = t0 + std::chrono::seconds(20);
          RF_ASSERT(s.endpoint->wait([&] { return shm::load_word(word) == 42; }, deadline, o));
          RF_ASSERT(Clock::now() - t0 < std::chrono::seconds(10));
          RF_ASSERT(s.endpoint->sleeps() >= 1);
        }
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// A spin longer than the call's timeout ends at the deadline: a waiter
// whose peer never signals returns false once the deadline passes, not after
// its whole spin (a 60 s spin hung a 300 ms call on the same-host direct
// path before the spin was capped).
TEST(MemoryChannel, SpinNeverOutlastsTheDeadline) {
  alignas(8) std::byte bell[Doorbell::kBytes] = {};
  const MemoryEndpoint endpoint(bell);
  shm::PollOptions o;
  o.spin = std::chrono::seconds(60);
  const auto t0 = Clock::now();
  EXPECT_FALSE(endpoint.wait([] { return false; }, t0 + Millis(300), o));
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, Millis(300));
  EXPECT_LT(took, std::chrono::seconds(10)) << "the 60 s spin ran past the deadline";
}

// Fd sleepers (common/doorbell.h): a ping-pong where every wait announces
// itself, looks once more and then sleeps in ppoll on the wake socket with a
// timeout only a lost wake-up would reach (no recheck slices to hide one).
// Each side also rings its own doorbell from a second thread now and then
// (a local event, as the fabric's progress threads do), so the sleeper is
// woken by strangers too and must look again. 20,000 rounds: a lost wake-up
// fails the run with the round it was lost in.
TEST(MemoryChannel, FdSleeperIsWokenByEverySignal) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start_connected(rank, ex));
        const int wake_fd = s.endpoint->wake_fd();
        RF_ASSERT(wake_fd >= 0);  // the peer reached this rank's wake socket
        std::shared_ptr<const void> keep;
        const Doorbell local = s.endpoint->local_ringer(keep);
        std::atomic<bool> stop{false};
        std::thread stranger([&] {
          while (!stop.load()) {
            local.ring();
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        });
        RF_ASSERT_OK(ex.barrier());
        const Doorbell& bell = s.endpoint->doorbell();
        const std::byte* word = s.local() + kWord;
        uint64_t lost_in = 0;
        for (uint64_t round = 1; round <= 20000 && lost_in == 0; ++round) {
          if ((round % 2 == 1) == (rank == 0)) {
            if (!s.memory().signal(kWord, round).is_ok()) lost_in = round;
            continue;
          }
          bell.announce_fd();
          while (shm::load_word(word) != round) {
            pollfd p{wake_fd, POLLIN, 0};
            if (::poll(&p, 1, 20000) != 1) {
              lost_in = round;
              break;
            }
            shm::drain_wake_fd(wake_fd);
          }
          bell.retire_fd();
        }
        stop.store(true);
        stranger.join();
        EXPECT_EQ(lost_in, 0u) << "rank " << rank << " not woken in round " << lost_in;
        RF_ASSERT_OK(ex.barrier());
        return lost_in == 0 ? 0 : 1;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// Outside the grant: refused with an error naming the peer, nothing written
// (the peer's guard bytes and the grant's last bytes stay as they were).
TEST(MemoryChannel, OutOfRangePutAndSignalAreRefused) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start(backend_row("ucx_shm"), rank, ex));
        RF_ASSERT_OK(s.connect());
        MemoryChannel& mc = s.memory();
        RF_ASSERT(mc.connected());
        if (rank == 0) {
          Buffer src(kGrant + kPage);
          std::memset(src.p, 0x5A, src.size);
          auto refused = [&](const Status& st, Code code) {
            return st.code() == code && st.peer() == 1;
          };
          RF_ASSERT(refused(mc.put(kGrant - 4, src.p, 8), Code::kOutOfRange));
          RF_ASSERT(refused(mc.put(0, src.p, kGrant + 1), Code::kOutOfRange));
          RF_ASSERT(refused(mc.put(kGrant + 1, src.p, 0), Code::kOutOfRange));
          RF_ASSERT(refused(mc.put(~uint64_t{0} - 2, src.p, 8), Code::kOutOfRange));
          RF_ASSERT(refused(mc.signal(kGrant, 1), Code::kOutOfRange));
          RF_ASSERT(refused(mc.signal(kGrant - 4, 1), Code::kOutOfRange));
          RF_ASSERT(refused(mc.signal(12, 1), Code::kInvalidArgument));  // not aligned
          RF_ASSERT(!MemoryChannel{}.put(0, src.p, 1).is_ok());
          RF_ASSERT(!MemoryChannel{}.put(0, src.p, 0).is_ok());
          RF_ASSERT(!MemoryChannel{}.signal(0, 1).is_ok());
          const Status st = mc.put(kGrant - 4, src.p, 8);
          RF_ASSERT(st.to_string().find("exceeds the 32768 bytes") != std::string::npos);
          RF_ASSERT_OK(mc.put(kPage, src.p, 16));  // inside: fine
        }
        RF_ASSERT_OK(ex.barrier());
        if (rank == 1) {
          const uint8_t* g = reinterpret_cast<const uint8_t*>(s.local());
          for (size_t i = 0; i < kGrant; ++i) {
            const uint8_t want = i >= kPage && i < kPage + 16 ? 0x5A : 0;
            RF_ASSERT(g[i] == want);
          }
          RF_ASSERT(s.guards_intact());
        }
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// Rank 1's grant lies in the ragged first page of its region, which is not
// shared: rank 0 cannot map it, rank 1 can map rank 0's. Neither side takes
// the memory channel, and the Channel's message streams are still in step.
TEST(MemoryChannel, PairFallsBackWhenOneSideCannotMap) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        size_t register_at = 0;
        if (rank == 1) {
          register_at = 100;
          s.grant_at = 100;
          s.grant_len = 200;
        }
        RF_ASSERT_OK(s.start(backend_row("ucx_shm"), rank, ex, register_at));
        RF_ASSERT_OK(s.connect());
        RF_ASSERT(!s.memory().connected());
        auto view = s.channel().direct_view(s.peer_key, 0, s.peer_key.length, kOpTimeout);
        if (rank == 0) {
          RF_ASSERT(view.status().code() == Code::kNotViable);
        } else {
          RF_ASSERT_OK(view);
        }
        RF_ASSERT_OK(send_text(s.channel(), "after setup " + std::to_string(rank)));
        RF_ASSERT_OK(expect_text(s.channel(), "after setup " + std::to_string(1 - rank)));
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// A rank that does not offer (the collectives' RDMAFLOW_COLL_DIRECT=0) leaves
// its peer on the Channel too.
TEST(MemoryChannel, PairFallsBackWhenOneSideDoesNotOffer) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start(backend_row("ucx_shm"), rank, ex));
        RF_ASSERT_OK(s.connect(/*offer=*/rank == 0));
        RF_ASSERT(!s.memory().connected());
        RF_ASSERT_OK(send_text(s.channel(), "after setup " + std::to_string(rank)));
        RF_ASSERT_OK(expect_text(s.channel(), "after setup " + std::to_string(1 - rank)));
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// tcp reaches a peer's memory only through its channel.
TEST(MemoryChannel, TcpNeverMaps) {
  auto r = run_ranks(
      2,
      [&](int rank, int, Exchange& ex) {
        Side s;
        RF_ASSERT_OK(s.start(backend_row("tcp"), rank, ex));
        RF_ASSERT_OK(s.connect());
        RF_ASSERT(!s.memory().connected());
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
