#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <string>

#include "transport/verbs/flow_control.h"
#include "transport/verbs/notify.h"

namespace rdmaflow::verbs {
namespace {

// ---------------------------------------------------------------- SendWindow

TEST(SendWindow, PostsUpToCapacityAndQueuesTheRest) {
  SendWindow<int> w(3);
  for (int i = 0; i < 5; ++i) w.push(i, 1);
  std::vector<int> posted;
  while (auto next = w.pop_ready([](int) { return true; })) posted.push_back(next->first);
  EXPECT_EQ(posted, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(w.in_flight(), 3u);
  EXPECT_EQ(w.queued(), 2u);
  EXPECT_EQ(w.free_slots(), 0u);

  EXPECT_TRUE(w.release(1));
  auto next = w.pop_ready([](int) { return true; });
  ASSERT_TRUE(next);
  EXPECT_EQ(next->first, 3);
  EXPECT_FALSE(w.pop_ready([](int) { return true; }));
  EXPECT_TRUE(w.release(2));
  next = w.pop_ready([](int) { return true; });
  ASSERT_TRUE(next);
  EXPECT_EQ(next->first, 4);
  EXPECT_EQ(w.queued(), 0u);
  EXPECT_TRUE(w.release(2));
  EXPECT_TRUE(w.empty());
}

TEST(SendWindow, MultiSlotItemsWaitForEnoughSlotsInOrder) {
  SendWindow<char> w(4);
  w.push('a', 2);
  w.push('b', 2);
  w.push('c', 1);
  auto a = w.pop_ready([](char) { return true; });
  auto b = w.pop_ready([](char) { return true; });
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->second, 2u);
  EXPECT_EQ(w.free_slots(), 0u);
  EXPECT_FALSE(w.pop_ready([](char) { return true; }));
  w.push('d', 2);
  w.release(1);  // one slot free: 'c' (1 slot) may go
  auto c = w.pop_ready([](char) { return true; });
  ASSERT_TRUE(c);
  EXPECT_EQ(c->first, 'c');
  w.release(1);  // one slot free, 'd' needs 2: waits
  EXPECT_FALSE(w.pop_ready([](char) { return true; }));
  w.release(1);
  auto d = w.pop_ready([](char) { return true; });
  ASSERT_TRUE(d);
  EXPECT_EQ(d->first, 'd');
}

TEST(SendWindow, SlotCountsAreClampedToCapacity) {
  SendWindow<int> w(2);
  w.push(1, 5);  // would never fit; clamped so it cannot wedge the queue
  w.push(2, 0);  // treated as 1
  auto a = w.pop_ready([](int) { return true; });
  ASSERT_TRUE(a);
  EXPECT_EQ(a->second, 2u);
  w.release(2);
  auto b = w.pop_ready([](int) { return true; });
  ASSERT_TRUE(b);
  EXPECT_EQ(b->second, 1u);
  EXPECT_EQ(SendWindow<int>(0).capacity(), 2u);
}

TEST(SendWindow, HeadBlockedOnOtherResourcesBlocksTheQueue) {
  SendWindow<int> w(8);
  w.push(1, 1);  // e.g. a SEND without credits
  w.push(2, 1);  // e.g. a READ that needs none: still waits (ordering)
  EXPECT_FALSE(w.pop_ready([](int v) { return v != 1; }));
  EXPECT_EQ(w.in_flight(), 0u);
  auto a = w.pop_ready([](int) { return true; });
  ASSERT_TRUE(a);
  EXPECT_EQ(a->first, 1);
}

TEST(SendWindow, ReserveRemoveAndTakeAll) {
  SendWindow<int> w(2);
  EXPECT_TRUE(w.try_reserve(1));
  EXPECT_TRUE(w.try_reserve(1));
  EXPECT_FALSE(w.try_reserve(1));
  for (int i = 0; i < 6; ++i) w.push(i, 1);
  auto odd = w.remove_if([](int v) { return v % 2 == 1; });
  EXPECT_EQ(odd, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(w.queued(), 3u);
  auto rest = w.take_all();
  EXPECT_EQ(rest, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_TRUE(w.empty());
}

TEST(SendWindow, OverReleaseIsReported) {
  SendWindow<int> w(4);
  EXPECT_TRUE(w.try_reserve(2));
  EXPECT_FALSE(w.release(3));
  EXPECT_EQ(w.in_flight(), 0u);
}

TEST(SendWindow, CompletionQueueCannotOverrun) {
  // Random posting and completion: in flight never exceeds capacity, and every
  // item is posted exactly once, in order.
  std::mt19937 rng(7);
  SendWindow<int> w(16);
  std::deque<std::pair<int, uint32_t>> posted;
  int next_push = 0;
  int next_expected = 0;
  for (int step = 0; step < 20000; ++step) {
    int r = static_cast<int>(rng() % 3);
    if (r == 0 && next_push < 5000) {
      w.push(next_push++, 1 + rng() % 2);
    } else if (r == 1) {
      while (auto p = w.pop_ready([](int) { return true; })) {
        EXPECT_EQ(p->first, next_expected++);
        posted.push_back(*p);
      }
    } else if (!posted.empty()) {
      w.release(posted.front().second);
      posted.pop_front();
    }
    uint32_t sum = 0;
    for (auto& p : posted) sum += p.second;
    ASSERT_EQ(sum, w.in_flight());
    ASSERT_LE(w.in_flight(), w.capacity());
  }
}

// ---------------------------------------------------------------- CreditCounter

TEST(CreditCounter, LastCreditIsReservedForCreditMessages) {
  CreditCounter c(4, 4);
  EXPECT_EQ(c.available(), 4u);
  EXPECT_TRUE(c.consume(false));
  EXPECT_TRUE(c.consume(false));
  EXPECT_TRUE(c.consume(false));
  EXPECT_EQ(c.available(), 1u);
  EXPECT_FALSE(c.can_send());
  EXPECT_FALSE(c.consume(false));
  EXPECT_TRUE(c.can_send_credit_message());
  EXPECT_TRUE(c.consume(true));
  EXPECT_FALSE(c.consume(true));
  EXPECT_EQ(c.available(), 0u);
}

TEST(CreditCounter, GrantsCannotExceedTheWindow) {
  CreditCounter c(8, 8);
  EXPECT_FALSE(c.grant(1));  // nothing outstanding
  c.consume(false);
  c.consume(false);
  EXPECT_FALSE(c.grant(3));
  EXPECT_EQ(c.available(), 6u);
  EXPECT_TRUE(c.grant(2));
  EXPECT_EQ(c.available(), 8u);
  EXPECT_TRUE(c.grant(0));
}

TEST(CreditCounter, OwedCreditsAndThreshold) {
  CreditCounter c(16, 16);
  EXPECT_EQ(c.threshold(), 8u);
  for (int i = 0; i < 7; ++i) c.on_buffer_reposted();
  EXPECT_FALSE(c.credit_message_due());
  c.on_buffer_reposted();
  EXPECT_TRUE(c.credit_message_due());
  EXPECT_EQ(c.take_owed(), 8u);
  EXPECT_EQ(c.owed(), 0u);
  EXPECT_FALSE(c.credit_message_due());
  // Small windows still need two owed credits, so credit messages never ping-pong.
  EXPECT_EQ(CreditCounter(4, 4).threshold(), 2u);
  EXPECT_EQ(CreditCounter(4, 5).threshold(), 2u);
}

TEST(CreditCounter, DueOnlyWhenACreditMessageCanBeSent) {
  CreditCounter c(4, 4);
  for (int i = 0; i < 4; ++i) c.consume(i == 3);
  c.on_buffer_reposted();
  c.on_buffer_reposted();
  EXPECT_FALSE(c.credit_message_due());  // no credit left at all
  EXPECT_TRUE(c.grant(1));
  EXPECT_TRUE(c.credit_message_due());
}

TEST(CreditCounter, PeerWindowOpensLate) {
  CreditCounter c(0, 8);  // active side before the peer's hello
  c.on_buffer_reposted();
  EXPECT_FALSE(c.can_send());
  EXPECT_TRUE(c.grant(0));
  c.open_peer_window(6);
  EXPECT_EQ(c.available(), 6u);
  EXPECT_EQ(c.owed(), 1u);  // kept
}

// ---------------------------------------------------------------- two-peer model
//
// Two peers exchange SENDs (credits piggybacked), RDMA_WRITE_WITH_IMM notifies
// (inline and through the notify ring) and plain writes over an ordered link,
// with random delays in delivery and in receive processing. The model checks
// what the channel relies on: a peer never consumes more receive buffers than
// were reserved for it (no RNR), a ring slot is never overwritten before the
// receiver read it, and traffic always drains (no credit deadlock).

enum class Pkt { kData, kCredit, kImm, kPlainWrite };

struct Packet {
  Pkt type;
  uint32_t credits = 0;
  std::optional<uint32_t> slot;
  uint64_t value = 0;
};

struct Peer {
  Peer(uint32_t window) : credits(window, window), encoder(window), ring(window, 0) {}
  CreditCounter credits;
  NotifyEncoder encoder;       // into the other peer's ring
  std::vector<uint64_t> ring;  // our ring, written by the other peer
  std::deque<Pkt> app;         // operations waiting for credits
  std::deque<Packet> arrived;  // consumed a buffer, not yet processed
  uint32_t buffers_in_use = 0;
  uint64_t delivered = 0;
  uint64_t credit_messages_sent = 0;
  uint64_t consuming_sent = 0;
  uint64_t next_value = 0;
};

class CreditModel {
 public:
  CreditModel(uint32_t window, uint32_t seed) : window_(window), rng_(seed) {
    peers_.emplace_back(window);
    peers_.emplace_back(window);
  }

  // Sends what credits allow from peer `p` (the channel's pump).
  void pump(int p) {
    Peer& me = peers_[p];
    if (me.credits.credit_message_due()) {
      Packet pk{Pkt::kCredit};
      me.credits.consume(true);
      pk.credits = me.credits.take_owed();
      ++me.credit_messages_sent;
      ++me.consuming_sent;
      link_[p].push_back(pk);
    }
    while (!me.app.empty()) {
      Pkt t = me.app.front();
      Packet pk{t};
      if (t != Pkt::kPlainWrite) {
        if (!me.credits.can_send()) return;
        me.credits.consume(false);
        ++me.consuming_sent;
      }
      if (t == Pkt::kData) pk.credits = me.credits.take_owed();
      if (t == Pkt::kImm) {
        bool big = rng_() % 2 == 0;
        pk.value = big ? (uint64_t{1} << 40) + me.next_value++ : me.next_value++ % 1000;
        auto enc = me.encoder.encode(pk.value);
        EXPECT_TRUE(enc.is_ok());
        pk.slot = enc->ring_slot;
      }
      me.app.pop_front();
      link_[p].push_back(pk);
    }
  }

  // The next packet on the link from `p` reaches the other peer's NIC.
  bool arrive(int p) {
    if (link_[p].empty()) return false;
    Packet pk = link_[p].front();
    link_[p].pop_front();
    Peer& rx = peers_[1 - p];
    if (pk.type == Pkt::kPlainWrite) return true;
    // The ring write precedes the immediate on the same QP: lands right now.
    if (pk.slot) rx.ring[*pk.slot] = pk.value;
    EXPECT_LT(rx.buffers_in_use, window_) << "receiver ran out of buffers (RNR)";
    ++rx.buffers_in_use;
    rx.arrived.push_back(pk);
    return true;
  }

  // Peer `p` processes its oldest received buffer and re-posts it.
  bool process(int p) {
    Peer& me = peers_[p];
    if (me.arrived.empty()) return false;
    Packet pk = me.arrived.front();
    me.arrived.pop_front();
    EXPECT_TRUE(me.credits.grant(pk.credits)) << "peer returned more credits than outstanding";
    if (pk.type == Pkt::kImm && pk.slot) {
      EXPECT_EQ(me.ring[*pk.slot], pk.value) << "ring slot overwritten before it was read";
    }
    if (pk.type != Pkt::kCredit) ++me.delivered;
    --me.buffers_in_use;
    me.credits.on_buffer_reposted();
    pump(p);  // the channel pumps after each completion
    return true;
  }

  void enqueue(int p, Pkt t) { peers_[p].app.push_back(t); }

  void random_step() {
    int p = static_cast<int>(rng_() % 2);
    switch (rng_() % 4) {
      case 0:
        pump(p);
        break;
      case 1:
      case 2:
        arrive(p);
        break;
      default:
        process(p);
        break;
    }
  }

  // Runs until nothing moves; false if work is stuck (deadlock).
  bool drain(int max_rounds = 100000) {
    for (int round = 0; round < max_rounds; ++round) {
      bool moved = false;
      for (int p = 0; p < 2; ++p) {
        pump(p);
        while (arrive(p)) moved = true;
        while (process(p)) moved = true;
      }
      if (!moved) break;
    }
    for (auto& peer : peers_) {
      if (!peer.app.empty() || !peer.arrived.empty()) return false;
    }
    return link_[0].empty() && link_[1].empty();
  }

  Peer& peer(int p) { return peers_[p]; }
  std::mt19937& rng() { return rng_; }

 private:
  uint32_t window_;
  std::mt19937 rng_;
  std::vector<Peer> peers_;
  std::deque<Packet> link_[2];
};

class CreditModelTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

TEST_P(CreditModelTest, BidirectionalMixedTrafficDrainsWithoutOverrun) {
  auto [window, seed] = GetParam();
  CreditModel m(window, seed);
  uint64_t sent[2] = {0, 0};
  for (int step = 0; step < 30000; ++step) {
    if (m.rng()() % 3 == 0) {
      int p = static_cast<int>(m.rng()() % 2);
      Pkt t = static_cast<Pkt>(m.rng()() % 4);
      if (t == Pkt::kCredit) t = Pkt::kData;  // credit messages are internal
      if (t != Pkt::kPlainWrite) ++sent[p];
      m.enqueue(p, t);
    }
    m.random_step();
    if (::testing::Test::HasFailure()) return;
  }
  ASSERT_TRUE(m.drain()) << "traffic stuck: credit deadlock";
  EXPECT_EQ(m.peer(1).delivered, sent[0]);
  EXPECT_EQ(m.peer(0).delivered, sent[1]);
}

TEST_P(CreditModelTest, OneWayNotifiesAreCreditedBackByCreditMessages) {
  auto [window, seed] = GetParam();
  CreditModel m(window, seed);
  const uint64_t n = 5000;
  for (uint64_t i = 0; i < n; ++i) {
    m.enqueue(0, Pkt::kImm);
    for (int k = 0; k < 3; ++k) m.random_step();
    if (::testing::Test::HasFailure()) return;
  }
  ASSERT_TRUE(m.drain()) << "notifies stuck: credit deadlock";
  EXPECT_EQ(m.peer(1).delivered, n);
  // The receiver returns credits in batches of about window / 2.
  uint64_t threshold = std::max<uint32_t>(2, window / 2);
  EXPECT_LE(m.peer(1).credit_messages_sent, n / (threshold - 1) + 2);
  EXPECT_GE(m.peer(1).credit_messages_sent + 1, n / window);
}

INSTANTIATE_TEST_SUITE_P(Windows, CreditModelTest,
                         ::testing::Combine(::testing::Values(4u, 5u, 8u, 64u),
                                            ::testing::Values(1u, 2u, 3u)),
                         [](const auto& info) {
                           return "window" + std::to_string(std::get<0>(info.param)) + "_seed" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace rdmaflow::verbs
