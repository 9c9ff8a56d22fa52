// Held acknowledgements on the ucx backend (RDMAFLOW_UCX_HOLD_ACKS, docs/ucx.md,
// "Acknowledgements"), between real processes. A write that travels as an active
// message completes at the writer when the receiver acknowledges it; the receiver
// holds that acknowledgement for a moment after delivering the write's notify, so
// that it leaves behind the answer the woken waiter usually sends at once. These
// tests play receivers that never answer: the acknowledgement must still leave,
// whether the receiver's threads go quiet, wait on something else, or close the
// channel right after the notify (then before the goodbye, so the write succeeds).
// The regions are smaller than a page, so the same-host row takes the active-message
// path too (a page-sized region would be copied directly and need no acknowledgement).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/transport/conformance_util.h"

namespace rdmaflow::testing {
namespace {

constexpr size_t kBytes = 64;
constexpr int kRounds = 20;
// Short enough that a held acknowledgement nobody releases fails the write well
// before the test's own timeout.
constexpr Millis kWriteTimeout(10000);

class UcxHeldAck : public ::testing::TestWithParam<const char*> {};

BackendRow held_row(const char* label) {
  BackendRow b = backend_row(label);
  b.env.emplace_back("RDMAFLOW_UCX_HOLD_ACKS", "1");
  return b;
}

// Rank 0's region is the target, rank 1's the source: rank 0 exposes its
// buffer, rank 1 registers its own and gets rank 0's key (rank 0's stays empty).
Status share_target(Node& node, Buffer& buf, int rank, Exchange& ex, RemoteKey& key) {
  std::string mine;
  if (rank == 1) RDMAFLOW_RETURN_IF_ERROR(node.local(buf));
  if (rank == 0) {
    RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey own, node.expose(buf.p, kBytes));
    mine = key_bytes(own);
  }
  RDMAFLOW_ASSIGN_OR_RETURN(auto all, ex.allgather(mine));
  if (rank == 0) return Status::ok();
  RDMAFLOW_ASSIGN_OR_RETURN(key, parse_key(all[0]));
  return Status::ok();
}

// Runs `side(rank, ch, buf, key, ex)` on 2 ranks of the held row `label`,
// connected, with rank 0's region the target (share_target).
template <class Side>
void run_pair(const char* label, Side side) {
  const BackendRow b = held_row(label);
  RunOptions o;
  o.timeout = Millis(120000);
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(b, rank, world, ex));
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        Buffer buf(kBytes);
        RemoteKey key;
        RF_ASSERT_OK(share_target(node, buf, rank, ex, key));
        return side(rank, ch, buf, key, ex);
      },
      o);
  RF_EXPECT_RUN_OK(r);
}

// Rank 1 writes with notify; rank 0 takes the notify and then leaves the channel
// alone (an out-of-band barrier), in turn idle, sleeping, or waiting on a message
// that only comes at the end. Every write must complete, and succeed.
TEST_P(UcxHeldAck, WritesCompleteWhenTheReceiverNeverAnswers) {
  run_pair(GetParam(), [](int rank, Channel& ch, Buffer& buf, const RemoteKey& key, Exchange& ex) {
    if (rank == 1) {
      for (int i = 0; i < kRounds; ++i) {
        fill_pattern(buf.p, kBytes, static_cast<uint64_t>(i));
        RF_ASSERT_OK(
            write_sync(ch, buf.p, kBytes, key, 0, static_cast<uint64_t>(i), kWriteTimeout));
        RF_ASSERT_OK(ex.barrier());
      }
      RF_ASSERT_OK(send_text(ch, "done"));
      return 0;
    }
    for (int i = 0; i < kRounds; ++i) {
      RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kWriteTimeout));
      RF_ASSERT(v == static_cast<uint64_t>(i));
      RF_ASSERT(check_pattern(buf.p, kBytes, static_cast<uint64_t>(i)) < 0);
      // Nothing more on the channel until the writer saw its write complete.
      if (i % 3 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      RF_ASSERT_OK(ex.barrier(Millis(60000)));
    }
    RF_ASSERT_OK(expect_text(ch, "done"));
    return 0;
  });
}

// The receiver closes the channel as soon as the notify is in: the write it
// acknowledges (held or not) is acknowledged before the goodbye, so it succeeds.
TEST_P(UcxHeldAck, CloseRightAfterTheNotifyStillAcknowledgesTheWrite) {
  run_pair(GetParam(), [](int rank, Channel& ch, Buffer& buf, const RemoteKey& key, Exchange& ex) {
    if (rank == 1) {
      fill_pattern(buf.p, kBytes, 7);
      RF_ASSERT_OK(write_sync(ch, buf.p, kBytes, key, 0, uint64_t{7}, kWriteTimeout));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kWriteTimeout));
    RF_ASSERT(v == 7);
    ch.close();
    RF_ASSERT_OK(ex.barrier(Millis(60000)));
    return 0;
  });
}

INSTANTIATE_TEST_SUITE_P(Rows, UcxHeldAck, ::testing::Values("ucx_shm", "ucx_tcp"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
}  // namespace rdmaflow::testing
