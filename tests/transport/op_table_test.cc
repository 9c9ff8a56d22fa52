// The operation machinery every backend shares (transport/common/op_table.h,
// sticky_error.h): generation-checked ids, exactly-once completion, the
// deadline sweep and its wording, and the sticky error.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "transport/common/op_table.h"
#include "transport/common/sticky_error.h"

namespace rdmaflow {
namespace {

using std::chrono::milliseconds;

struct TestOp : OpRecord {
  const char* what = "write";
  std::string state = "still queued to send";
  int tag = 0;
  const char* name() const { return what; }
};

// An op due `after` past `base` (set directly, so the test does not race the clock).
TestOp* make(OpTable<TestOp>& table, OpLedger<TestOp>& ledger, int tag, OpClock::time_point base,
             milliseconds after) {
  TestOp* op = table.acquire();
  op->tag = tag;
  op->peer = 3;
  op->timeout = after;
  op->deadline = base + after;
  ledger.add(op);
  return op;
}

TEST(OpTable, ReleasedIdsAreRefusedAndSlotsAreReused) {
  OpTable<TestOp> table;
  TestOp* a = table.acquire();
  TestOp* b = table.acquire();
  const uint64_t a_id = a->id;
  EXPECT_NE(a_id, b->id);
  EXPECT_EQ(table.find(a_id), a);
  EXPECT_EQ(table.live(), 2u);

  table.release(a);
  EXPECT_EQ(table.find(a_id), nullptr) << "a released op's id must not match any more";
  EXPECT_EQ(table.live(), 1u);

  TestOp* c = table.acquire();
  EXPECT_EQ(c, a) << "the slot is pooled, not allocated again";
  EXPECT_NE(c->id, a_id) << "a recycled slot gets a new generation";
  EXPECT_EQ(table.find(a_id), nullptr) << "a late reply to the old op finds nothing";
  EXPECT_EQ(table.find(c->id), c);
  EXPECT_FALSE(c->completed);
  EXPECT_EQ(c->deadline, OpClock::time_point::max());

  EXPECT_EQ(table.find(uint64_t{77}), nullptr) << "a slot the table never gave out";
  EXPECT_EQ(table.find((uint64_t{5} << 32) | (b->id & 0xffffffffu)), nullptr)
      << "right slot, wrong generation";
  table.release(c);
  table.release(c);  // twice: the second is ignored
  EXPECT_EQ(table.live(), 1u);
}

TEST(OpLedger, CompletionHappensExactlyOnce) {
  OpTable<TestOp> table;
  OpLedger<TestOp> ledger;
  const auto base = OpClock::now();
  TestOp* a = make(table, ledger, 1, base, milliseconds(100));
  TestOp* b = make(table, ledger, 2, base, milliseconds(100));
  EXPECT_EQ(ledger.size(), 2u);

  EXPECT_TRUE(ledger.complete(a));
  EXPECT_FALSE(ledger.complete(a)) << "a second completion must be a no-op";
  EXPECT_FALSE(ledger.complete(a));
  EXPECT_EQ(ledger.repeated_completions(), 2u);
  EXPECT_EQ(ledger.size(), 1u);

  // A completed op is neither swept nor visited, even once overdue.
  int swept = 0;
  ledger.sweep(
      base + milliseconds(500), [](const TestOp& op) { return op.state; },
      [&](TestOp& op, Status st) {
        ++swept;
        EXPECT_EQ(op.tag, 2);
        EXPECT_EQ(st.code(), Code::kTimeout);
        return ledger.complete(&op);
      });
  EXPECT_EQ(swept, 1);
  EXPECT_TRUE(ledger.empty());
  EXPECT_FALSE(ledger.complete(b)) << "swept, then completed late: nothing happens";
  EXPECT_EQ(ledger.repeated_completions(), 3u);

  // An op that owes no completion is never listed.
  TestOp* internal = table.acquire();
  internal->completed = true;
  ledger.add(internal);
  EXPECT_TRUE(ledger.empty());
}

TEST(OpLedger, SweepExpiresOverdueOpsOldestFirstWithOneWording) {
  OpTable<TestOp> table;
  OpLedger<TestOp> ledger;
  const auto base = OpClock::now();
  make(table, ledger, 1, base, milliseconds(50));
  TestOp* b = make(table, ledger, 2, base, milliseconds(10));
  b->what = "read";
  b->state = "sent, no reply from the peer";
  make(table, ledger, 3, base, milliseconds(30));
  make(table, ledger, 4, base, milliseconds(1000));
  TestOp* untimed = table.acquire();  // e.g. a read served for the peer: no deadline
  untimed->tag = 5;
  ledger.add(untimed);
  EXPECT_EQ(ledger.earliest_deadline(), base + milliseconds(10));

  std::vector<int> order;
  std::vector<Status> statuses;
  auto expire = [&](TestOp& op, Status st) {
    order.push_back(op.tag);
    statuses.push_back(st);
    return ledger.complete(&op);
  };
  auto state = [](const TestOp& op) { return std::string_view(op.state); };

  ledger.sweep(base + milliseconds(5), state, expire);
  EXPECT_TRUE(order.empty()) << "nothing is due yet";

  ledger.sweep(base + milliseconds(40), state, expire);
  EXPECT_EQ(order, (std::vector<int>{2, 3})) << "due ops expire in the order they were issued";
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].code(), Code::kTimeout);
  EXPECT_EQ(statuses[0].op(), "read");
  EXPECT_EQ(statuses[0].peer(), 3);
  EXPECT_EQ(statuses[0].reason(), "not completed within 10 ms (sent, no reply from the peer)");
  EXPECT_EQ(statuses[1].reason(), "not completed within 30 ms (still queued to send)");
  EXPECT_NE(statuses[1].where().find("op_table_test.cc"), std::string::npos)
      << "the status names the sweep's caller: " << statuses[1].where();

  // The deadline that passed exactly now is due, and `expire` can end the sweep.
  order.clear();
  TestOp* late = make(table, ledger, 6, base, milliseconds(60));
  ledger.sweep(base + milliseconds(60), state, [&](TestOp& op, Status) {
    order.push_back(op.tag);
    return false;  // e.g. the channel must fail instead
  });
  EXPECT_EQ(order, (std::vector<int>{1})) << "stopped after the first due op";
  EXPECT_EQ(ledger.size(), 4u);

  order.clear();
  ledger.sweep(base + milliseconds(60), state, expire);
  EXPECT_EQ(order, (std::vector<int>{1, 6}));
  EXPECT_TRUE(late->completed);

  // What is left: the far deadline and the untimed op; for_each visits both in order.
  order.clear();
  ledger.for_each([&](TestOp& op) {
    order.push_back(op.tag);
    ledger.complete(&op);  // failing everything at once
  });
  EXPECT_EQ(order, (std::vector<int>{4, 5}));
  EXPECT_TRUE(ledger.empty());
  EXPECT_EQ(ledger.earliest_deadline(), OpClock::time_point::max());
}

TEST(Deadlines, AreClampedAndWordedOnce) {
  const auto now = OpClock::now();
  EXPECT_EQ(deadline_after(milliseconds(250), now), now + milliseconds(250));
  EXPECT_EQ(deadline_after(milliseconds(-5), now), now) << "a negative timeout is due at once";
  const auto forever = deadline_after(milliseconds::max(), now);
  EXPECT_GT(forever, now + std::chrono::hours(24 * 300)) << "no overflow into the past";
  EXPECT_LE(forever, now + std::chrono::hours(24 * 366));

  Status st = timeout_status("send message", 1, milliseconds(300), "");
  EXPECT_EQ(st.reason(), "not completed within 300 ms");
  st = timeout_status("write", 2, milliseconds(300), "partly sent");
  EXPECT_EQ(
      st.to_string().rfind(
          "write (peer rank 2) failed: timeout: not completed within 300 ms (partly sent)", 0),
      0u)
      << st.to_string();
}

TEST(StickyError, FirstErrorWinsAndNamesThePeerForEveryLaterOp) {
  StickyError sticky;
  EXPECT_TRUE(sticky.ok());
  EXPECT_TRUE(sticky.get().is_ok());
  EXPECT_TRUE(sticky.for_op("write").is_ok());
  EXPECT_FALSE(sticky.set(Status::ok())) << "OK is not an error";
  EXPECT_TRUE(sticky.ok());

  EXPECT_TRUE(sticky.set(Status(Code::kPeerFailed, "channel", 4, "connection reset")));
  EXPECT_FALSE(sticky.set(Status(Code::kCancelled, "channel", 4, "channel closed")));
  EXPECT_FALSE(sticky.ok());
  EXPECT_EQ(sticky.get().code(), Code::kPeerFailed);
  const Status later = sticky.for_op("read");
  EXPECT_EQ(later.code(), Code::kPeerFailed);
  EXPECT_EQ(later.op(), "read");
  EXPECT_EQ(later.peer(), 4);
  EXPECT_EQ(later.reason(), "connection reset");
}

TEST(StickyError, RacingSettersAgreeOnOneError) {
  for (int round = 0; round < 20; ++round) {
    StickyError sticky;
    std::atomic<int> winners{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        if (sticky.set(Status(Code::kPeerFailed, "channel", t, "failure " + std::to_string(t)))) {
          winners.fetch_add(1);
        }
        // Whoever reads after a set sees a complete error, the same for everyone.
        const Status seen = sticky.get();
        EXPECT_FALSE(seen.is_ok());
        EXPECT_EQ(seen.reason(), "failure " + std::to_string(seen.peer()));
      });
    }
    go.store(true);
    for (auto& th : threads) th.join();
    EXPECT_EQ(winners.load(), 1);
  }
}

}  // namespace
}  // namespace rdmaflow
