// The notify ring of UCX direct channels (transport/shm/notify_ring.h, docs/ucx.md
// "Notify ring"), in real processes over UCX shared memory: notifies published in
// the ring stay in order with messages and am-path writes, a full ring falls back
// to active messages without reordering, a sleeping receiver is woken, a corrupt
// ring fails the channel naming the writer, and RDMAFLOW_UCX_NOTIFY_RING=0 keeps
// the active-message path.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_util.h"
#include "transport/shm/notify_ring.h"
#include "transport/ucx/ucx_channel.h"

namespace rdmaflow::testing {
namespace {

using shm::NotifyRing;
using shm::RingSlot;
using ucx::notify_ring_for_testing;

constexpr Millis kOpTimeout(20000);

BackendRow shm(std::vector<std::pair<std::string, std::string>> extra = {}) {
  BackendRow b = backend_row("ucx_shm");
  for (auto& e : extra) b.env.push_back(e);
  return b;
}

RunOptions opts(int seconds = 60) {
  RunOptions o;
  o.timeout = Millis(seconds * 1000);
  return o;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Item i of the ordering stream: a message, a write the receiver places itself (am
// path: the ragged first page of the grant is not shared), or a direct write whose
// notify goes through the ring.
enum class Kind { kMessage, kAmWrite, kRingWrite };
Kind kind_of(int i) {
  if (i % 7 == 3) return Kind::kMessage;
  if (i % 5 == 1) return Kind::kAmWrite;
  return Kind::kRingWrite;
}

// Writer issues batches of mixed items; the receiver waits for the batch's last item
// only and then finds every earlier item of the batch already there, in order.
int order_rank(const BackendRow& b, bool ring_expected, int rank, int world, Exchange& ex) {
  constexpr int kBatches = 150;
  constexpr int kBatch = 16;
  constexpr size_t kPage = 4096;
  constexpr size_t kSkew = 100;  // the grant starts 100 bytes into a page
  Node node;
  RF_ASSERT_OK(node.connect_all(b, rank, world, ex));
  Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
  if (rank == 1) {
    Buffer region(64 * kPage);
    RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p + kSkew, 32 * kPage));
    RF_ASSERT_OK(ex.allgather(key_bytes(key)));
    for (int batch = 0; batch < kBatches; ++batch) {
      const int first = batch * kBatch, last = first + kBatch - 1;
      std::vector<int> notifies, messages;
      for (int i = first; i <= last; ++i) {
        (kind_of(i) == Kind::kMessage ? messages : notifies).push_back(i);
      }
      if (kind_of(last) == Kind::kMessage) {
        // Messages in order; once the last is here, every notify before it is too.
        for (int i : messages) RF_ASSERT_OK(expect_text(ch, "m" + std::to_string(i)));
        for (int i : notifies) {
          auto v = ch.inbox().poll_notify();
          RF_ASSERT(v.has_value());
          RF_ASSERT(*v == static_cast<uint64_t>(i));
        }
      } else {
        RF_ASSERT_OK(ch.inbox().wait_notify_value(static_cast<uint64_t>(last), kOpTimeout));
        for (int i : notifies) {
          if (i == last) continue;
          auto v = ch.inbox().poll_notify();
          RF_ASSERT(v.has_value());
          RF_ASSERT(*v == static_cast<uint64_t>(i));
        }
        for (int i : messages) RF_ASSERT_OK(expect_text(ch, "m" + std::to_string(i), Millis(0)));
      }
      RF_ASSERT(!ch.inbox().poll_notify().has_value());
      RF_ASSERT_OK(send_text(ch, "credit"));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  }
  Buffer src(kPage);
  RF_ASSERT_OK(node.local(src));
  RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
  RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
  for (int batch = 0; batch < kBatches; ++batch) {
    CompletionGroup group;
    for (int i = batch * kBatch; i < (batch + 1) * kBatch; ++i) {
      const auto n = static_cast<uint64_t>(i);
      switch (kind_of(i)) {
        case Kind::kMessage: {
          const std::string m = "m" + std::to_string(i);
          ch.send_message(std::vector<uint8_t>(m.begin(), m.end()), group.add(), kOpTimeout);
          break;
        }
        case Kind::kAmWrite:  // the first, unshared page of the grant
          ch.write(src.p, 64, key, 8 * (i % 64), n, group.add(), kOpTimeout);
          break;
        case Kind::kRingWrite:  // whole shared pages
          ch.write(src.p, 8 + i % 300, key, kPage + 512 * (i % 32), n, group.add(), kOpTimeout);
          break;
      }
    }
    RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000), "batch"));
    RF_ASSERT_OK(expect_text(ch, "credit"));
  }
  RF_ASSERT((notify_ring_for_testing(ch) != nullptr) == ring_expected);
  RF_ASSERT_OK(ex.barrier());
  return 0;
}

TEST(UcxRing, NotifiesStayInOrderWithMessagesAndAmWrites) {
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) { return order_rank(shm(), true, rank, world, ex); },
      opts());
  RF_EXPECT_RUN_OK(r);
}

TEST(UcxRing, RingOffKeepsTheActiveMessagePath) {
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        return order_rank(shm({{"RDMAFLOW_UCX_NOTIFY_RING", "0"}}), false, rank, world, ex);
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// Two slots and thousands of writes in flight: the writer falls back to the
// ordered active message whenever the ring is full, and nothing is reordered.
TEST(UcxRing, FullRingFallsBackWithoutReordering) {
  constexpr int kWrites = 6000;
  const BackendRow b = shm({{"RDMAFLOW_UCX_NOTIFY_RING_SLOTS", "2"}});
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(b, rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          Buffer region(kWrites * 8);
          std::memset(region.p, 0, region.size);
          RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
          RF_ASSERT_OK(ex.allgather(key_bytes(key)));
          for (int round = 0; round < 3; ++round) {
            // Let the writer run ahead so the ring fills up.
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            for (int i = 0; i < kWrites; ++i) {
              RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
              RF_ASSERT(v == static_cast<uint64_t>(round * kWrites + i));
              uint64_t cell = 0;
              std::memcpy(&cell, region.p + 8 * i, 8);
              RF_ASSERT(cell == v);  // the bytes are there when the notify is
            }
            RF_ASSERT_OK(send_text(ch, "next"));
          }
          RF_ASSERT_OK(ex.barrier());
          return 0;
        }
        std::vector<uint64_t> values(static_cast<size_t>(kWrites));
        RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
        RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
        for (int round = 0; round < 3; ++round) {
          CompletionGroup group;
          for (int i = 0; i < kWrites; ++i) {
            values[static_cast<size_t>(i)] = static_cast<uint64_t>(round * kWrites + i);
            ch.write(&values[static_cast<size_t>(i)], 8, key, 8 * static_cast<uint64_t>(i),
                     values[static_cast<size_t>(i)], group.add(), kOpTimeout);
          }
          RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000), "writes"));
          RF_ASSERT_OK(expect_text(ch, "next"));
        }
        auto ring = notify_ring_for_testing(ch);
        RF_ASSERT(ring != nullptr && ring->slots() == 2);
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts(90));
  RF_EXPECT_RUN_OK(r);
}

// The receiver waits long enough to fall asleep on its event fd (the waiting
// thread itself, or with RDMAFLOW_UCX_WAIT_BLOCK=0 the progress thread); a notify
// published in the ring must wake it at once. A lost wake-up would show as a delay
// up to the sleeper's 100 ms timeout (about 80 ms here; over 20 ms fails).
void sleeping_receiver_is_woken(const BackendRow& b) {
  constexpr int kRounds = 10;
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(b, rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          Buffer region(4096);
          RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
          RF_ASSERT_OK(ex.allgather(key_bytes(key)));
          RF_ASSIGN_OR_FAIL(uint64_t first, ch.inbox().wait_notify(kOpTimeout));  // warm-up
          RF_ASSERT(first == 0);
          int prompt = 0;
          std::vector<double> delays;
          for (int round = 0; round < kRounds; ++round) {
            RF_ASSERT_OK(send_text(ch, "go"));
            RF_ASSIGN_OR_FAIL(uint64_t sent, ch.inbox().wait_notify(kOpTimeout));
            const double ms = static_cast<double>(now_ns() - sent) / 1e6;
            delays.push_back(ms);
            if (ms < 20) ++prompt;
          }
          std::string all;
          for (double d : delays) all += std::to_string(d) + " ";
          EXPECT_GE(prompt, kRounds - 2) << "wake-up delays (ms): " << all;
          std::printf("wake-up delays (ms): %s\n", all.c_str());
          RF_ASSERT_OK(ex.barrier());
          return 0;
        }
        Buffer src(64);
        RF_ASSERT_OK(node.local(src));
        RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
        RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
        RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 0, uint64_t{0}));
        for (int round = 0; round < kRounds; ++round) {
          RF_ASSERT_OK(expect_text(ch, "go"));
          // The receiver is in wait_notify now: let it fall asleep (its sleep lasts at
          // most 100 ms, so a lost wake-up costs it about 80 ms here).
          std::this_thread::sleep_for(std::chrono::milliseconds(120));
          RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 0, now_ns()));
        }
        RF_ASSERT(notify_ring_for_testing(ch) != nullptr);
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

TEST(UcxRing, SleepingWaiterIsWoken) {
  sleeping_receiver_is_woken(shm());
}

TEST(UcxRing, SleepingProgressThreadIsWoken) {
  sleeping_receiver_is_woken(shm({{"RDMAFLOW_UCX_WAIT_BLOCK", "0"}}));
}

// The receiver's main thread sleeps (no wait at all) while the notify comes: its
// progress thread, asleep on the event fd, must be woken by the ring's wake-up and
// deliver the notify then, not at the end of its own (up to 100 ms) sleep.
TEST(UcxRing, IdleReceiverProgressThreadDeliversAtOnce) {
  constexpr int kRounds = 6;
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(shm(), rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          Buffer region(4096);
          RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
          RF_ASSERT_OK(ex.allgather(key_bytes(key)));
          RF_ASSIGN_OR_FAIL(uint64_t first, ch.inbox().wait_notify(kOpTimeout));  // warm-up
          RF_ASSERT(first == 0);
          std::atomic<uint64_t> delivered{0};
          ch.inbox().set_notify_listener([&] { delivered.store(now_ns()); });
          int prompt = 0;
          std::string all;
          for (int round = 0; round < kRounds; ++round) {
            RF_ASSERT_OK(send_text(ch, "go"));
            std::this_thread::sleep_for(std::chrono::milliseconds(150));  // not waiting
            auto sent = ch.inbox().poll_notify();
            RF_ASSERT(sent.has_value());
            const double ms = static_cast<double>(delivered.load() - *sent) / 1e6;
            all += std::to_string(ms) + " ";
            if (ms < 20) ++prompt;
          }
          ch.inbox().set_notify_listener(nullptr);
          EXPECT_GE(prompt, kRounds - 1) << "delivery delays (ms): " << all;
          std::printf("delivery delays (ms): %s\n", all.c_str());
          RF_ASSERT_OK(ex.barrier());
          return 0;
        }
        Buffer src(64);
        RF_ASSERT_OK(node.local(src));
        RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
        RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
        RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 0, uint64_t{0}));
        for (int round = 0; round < kRounds; ++round) {
          RF_ASSERT_OK(expect_text(ch, "go"));
          // The receiver's progress thread falls asleep after 20 us without work.
          std::this_thread::sleep_for(std::chrono::milliseconds(40));
          RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 0, now_ns()));
        }
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

// The writer plays a misbehaving peer: after one good notify it writes into the
// shared ring directly. The receiver fails the channel naming rank 0, never
// crashes or touches memory outside the grant.
enum class Corruption { kUnknownKey, kOutOfGrant, kTailJump, kStaleSequence };

void corrupt_ring_fails_the_channel(Corruption what, const std::string& expect) {
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(shm(), rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          Buffer region(8192);
          RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
          RF_ASSERT_OK(ex.allgather(key_bytes(key)));
          RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
          RF_ASSERT(v == 7);
          RF_ASSERT_OK(ex.barrier());  // the writer corrupts the ring now
          auto bad = ch.inbox().wait_notify(Millis(10000));
          RF_ASSERT(!bad.is_ok());
          const std::string text = bad.status().to_string();
          EXPECT_NE(text.find("peer rank 0"), std::string::npos) << text;
          EXPECT_NE(text.find("notify ring"), std::string::npos) << text;
          EXPECT_NE(text.find(expect), std::string::npos) << text;
          EXPECT_EQ(bad.status().peer(), 0);
          EXPECT_FALSE(ch.error().is_ok());
          RF_ASSERT_OK(ex.barrier());
          return 0;
        }
        Buffer src(64);
        RF_ASSERT_OK(node.local(src));
        RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
        RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
        RF_ASSERT_OK(write_sync(ch, src.p, 8, key, 4096, uint64_t{7}));
        RF_ASSERT_OK(ex.barrier());
        std::shared_ptr<NotifyRing> ring = notify_ring_for_testing(ch);
        RF_ASSERT(ring != nullptr);
        auto* h = ring->header();
        const uint64_t tail = h->tail.load();
        RF_ASSERT(tail == 1);
        RingSlot s = *ring->slot(tail - 1);  // the good entry, as a template
        s.seq += 1;
        switch (what) {
          case Corruption::kUnknownKey:
            s.key_id = 987654321;
            break;
          case Corruption::kOutOfGrant:
            s.offset = 8000;
            s.length = 4096;
            break;
          case Corruption::kStaleSequence:
            s.seq -= 1;
            break;
          case Corruption::kTailJump:
            break;
        }
        *ring->slot(tail) = s;
        h->tail.store(what == Corruption::kTailJump ? tail + 100000 : tail + 1);
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      opts());
  RF_EXPECT_RUN_OK(r);
}

TEST(UcxRing, CorruptEntryFailsTheChannelNamingThePeer) {
  corrupt_ring_fails_the_channel(Corruption::kUnknownKey, "key id 987654321 was never exported");
  corrupt_ring_fails_the_channel(Corruption::kOutOfGrant, "exceeds the 8192 bytes");
  corrupt_ring_fails_the_channel(Corruption::kStaleSequence, "sequence number");
  corrupt_ring_fails_the_channel(Corruption::kTailJump, "is not within the 1024 slots");
}

}  // namespace
}  // namespace rdmaflow::testing
