// Session over real forked processes and real loopback sockets: static
// transfers are single writes into planned slots, credits keep a fast sender
// from overwriting a slot the receiver still reads, dynamic tensors take the
// header-then-read path, and failures (timeouts, plan mismatch, a dead peer)
// come back as errors that name the transfer and the peer.
#include "runtime/session/session.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/counters.h"
#include "tests/session/session_test_util.h"
#include "tests/support/text.h"

namespace rdmaflow {
namespace {

using namespace std::chrono_literals;
using dev::free_port;
using testing::boot_rank;
using testing::pattern;
using testing::ping_pong_graph;
using testing::plan_of;
using testing::run_ranks;
using testing::RunOptions;

using testing::contains;

void fill(float* p, size_t n, uint64_t step, int salt) {
  for (size_t i = 0; i < n; ++i) p[i] = pattern(step, i, salt);
}

bool check(const float* p, size_t n, uint64_t step, int salt) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(step, i, salt)) return false;
  }
  return true;
}

// The sessions' timeout. Under ThreadSanitizer, at load 10 on 2 cores, the
// slow consumer of CreditsKeepSlotsUntilReleased/grpc needed more than 10 s
// for its 12 steps: the producer (gRPC has no credits to wait for) reached
// finish(), its allgather gave up and its server stopped under the consumer.
#if defined(__SANITIZE_THREAD__)
constexpr auto kTimeout = 60000ms;
#else
constexpr auto kTimeout = 10000ms;
#endif

class SessionTransport : public ::testing::TestWithParam<std::string> {};

// Session::create, ending the rank as skipped when the transport is not viable
// here (verbs without an RDMA device: scripts/softroce-vm runs those rows).
Result<std::unique_ptr<Session>> create_or_skip(const graph::TransferPlan& plan, Bootstrap& boot,
                                                const SessionOptions& so, testing::Exchange& ex) {
  auto s = Session::create(plan, boot, so);
  if (!s.is_ok() && s.status().code() == Code::kNotViable) ex.skip(s.status().to_string());
  return s;
}

// Ping-pong for many steps: every value checked on arrival, no staging copy,
// one write per transfer and step.
TEST_P(SessionTransport, StaticPingPong) {
  const std::string transport = GetParam();
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    constexpr int64_t n = 4096;
    constexpr int kSteps = 40;
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(n), world));
    SessionOptions so;
    so.transport = transport;
    so.timeout = kTimeout;
    RF_ASSIGN_OR_FAIL(auto s, create_or_skip(plan, *boot, so, ex));
    RF_ASSERT(s->transport_name() == transport);
    for (uint64_t step = 0; step < kSteps; ++step) {
      RF_ASSERT_OK(s->begin_step(step));
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto buf, s->output_buffer("ping", step, n * 4));
        RF_ASSERT(buf.has_value());
        fill(static_cast<float*>(buf->data), n, step, 1);
        RF_ASSERT_OK(s->send("ping", 1, step));
        RF_ASSIGN_OR_FAIL(RecvView v, s->recv("pong", 1, step));
        RF_ASSERT(v.bytes == n * 4 && v.dims == std::vector<int64_t>{n});
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 2));
      } else {
        RF_ASSIGN_OR_FAIL(RecvView v, s->recv("ping", 0, step));
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 1));
        RF_ASSIGN_OR_FAIL(auto buf, s->output_buffer("pong", step, n * 4));
        RF_ASSERT(buf.has_value());
        fill(static_cast<float*>(buf->data), n, step, 2);
        RF_ASSERT_OK(s->send("pong", 0, step));
      }
      RF_ASSERT_OK(s->end_step(step));
    }
    RF_ASSERT_OK(s->finish());
    SessionStats st = s->stats();
    RF_ASSERT(st.steps == kSteps);
    RF_ASSERT(st.writes == kSteps);
    RF_ASSERT(st.bytes_sent == kSteps * n * 4);
    RF_ASSERT(st.bytes_received == kSteps * n * 4);
    RF_ASSERT(st.staging_copies == 0);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A producer that runs ahead of a slow consumer must wait for credits instead
// of overwriting slots the consumer has not released. The consumer checks
// every slot's content twice, before and after a pause.
TEST_P(SessionTransport, CreditsKeepSlotsUntilReleased) {
  const std::string transport = GetParam();
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    constexpr int64_t n = 1 << 16;
    constexpr int kSteps = 12;
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    // One way only: "ping" from 0 to 1; 1 never answers.
    graph::GraphFile f = ping_pong_graph(n);
    f.placement.rank[2] = 1;  // "check" reads pong on rank 1: pong stays local
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(f, world, /*depth=*/2));
    RF_ASSERT(plan.transfers.size() == 1);
    SessionOptions so;
    so.transport = transport;
    so.timeout = kTimeout;
    RF_ASSIGN_OR_FAIL(auto s, create_or_skip(plan, *boot, so, ex));
    for (uint64_t step = 0; step < kSteps; ++step) {
      RF_ASSERT_OK(s->begin_step(step));
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto buf, s->output_buffer("ping", step, n * 4));
        fill(static_cast<float*>(buf->data), n, step, 3);
        RF_ASSERT_OK(s->send("ping", 1, step));
      } else {
        RF_ASSIGN_OR_FAIL(RecvView v, s->recv("ping", 0, step));
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 3));
        // The producer is ahead now. Step 0 is held long enough that the
        // producer must reach step `copies` (2) before it is released.
        std::this_thread::sleep_for(step == 0 ? 300ms : 10ms);
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 3));
      }
      RF_ASSERT_OK(s->end_step(step));
    }
    RF_ASSERT_OK(s->finish());
    if (rank == 0 && transport != "grpc") {
      // It had to wait: a consumer that holds step 0 for 300 ms with 2 slots.
      // Counted, not timed: a slow guest stretches the producer's own steps.
      RF_ASSERT(s->stats().credit_stalls >= 1);
      RF_ASSERT(s->stats().credit_wait_ms > 0);
      // The process's counters per peer (common/counters.h) saw the same
      // stalls, and every step's write to rank 1.
      uint64_t stalls = 0, sent = 0;
      for (const stats::PeerStats& p : stats::snapshot().peers) {
        if (p.peer != 1) continue;
        stalls += p.credit_stalls;
        sent += p.bytes_sent;
      }
      RF_ASSERT(stalls == s->stats().credit_stalls);
      RF_ASSERT(sent >= uint64_t{kSteps} * n * 4);
    }
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Dynamic shapes: payloads that fit the planned size travel with their header
// in one write; larger ones are read by the receiver from the sender.
TEST_P(SessionTransport, DynamicTensorsInlineAndRead) {
  const std::string transport = GetParam();
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    constexpr int64_t n = 64;
    constexpr int kSteps = 10;
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(n, true, /*hint_rows=*/8), world));
    SessionOptions so;
    so.transport = transport;
    so.timeout = kTimeout;
    RF_ASSIGN_OR_FAIL(auto s, create_or_skip(plan, *boot, so, ex));
    auto rows_at = [](uint64_t step) -> int64_t {
      return step % 3 == 0 ? 1000 + static_cast<int64_t>(step) : 1 + static_cast<int64_t>(step);
    };
    for (uint64_t step = 0; step < kSteps; ++step) {
      RF_ASSERT_OK(s->begin_step(step));
      const int64_t rows = rows_at(step);
      const size_t elems = static_cast<size_t>(rows * 16);
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto pb, s->output_buffer("ping", step, n * 4));
        fill(static_cast<float*>(pb->data), n, step, 1);
        RF_ASSERT_OK(s->send("ping", 1, step));
        // The schedule order (make_ping, Send ping, Recv pong, check, make_dyn,
        // Send dyn): rank 1 may reuse ping's slot for dyn once pong is sent.
        RF_ASSIGN_OR_FAIL(RecvView v, s->recv("pong", 1, step));
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 2));
        RF_ASSIGN_OR_FAIL(auto db, s->output_buffer("dyn", step, elems * 4));
        RF_ASSERT(db.has_value() && db->capacity >= elems * 4);
        fill(static_cast<float*>(db->data), elems, step, 5);
        SendSource src;
        src.dims = {rows, 16};
        RF_ASSERT_OK(s->send("dyn", 1, step, src));
      } else {
        RF_ASSIGN_OR_FAIL(RecvView p, s->recv("ping", 0, step));
        RF_ASSERT(check(static_cast<const float*>(p.data), n, step, 1));
        RF_ASSIGN_OR_FAIL(auto pb, s->output_buffer("pong", step, n * 4));
        for (size_t i = 0; i < n; ++i) static_cast<float*>(pb->data)[i] = pattern(step, i, 2);
        RF_ASSERT_OK(s->send("pong", 0, step));
        RF_ASSIGN_OR_FAIL(RecvView d, s->recv("dyn", 0, step));
        RF_ASSERT(d.dims == (std::vector<int64_t>{rows, 16}));
        RF_ASSERT(d.bytes == elems * 4);
        RF_ASSERT(check(static_cast<const float*>(d.data), elems, step, 5));
      }
      RF_ASSERT_OK(s->end_step(step));
    }
    RF_ASSERT_OK(s->finish());
    // Larger than the 8 planned rows: steps 0, 3, 6, 8 (9 rows) and 9.
    if (rank == 1 && transport != "grpc") RF_ASSERT(s->stats().reads == 5);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// The planner shares receive slots on the schedule order: on rank 1, dyn's slot
// may reuse ping's bytes because rank 0 sends dyn only after pong came back
// (and rank 1 sends pong only after reading ping). A Send issued before an
// earlier Recv of its rank's schedule is refused, naming both transfers, and
// the session carries on once the executor follows the order.
TEST_P(SessionTransport, SendBeforeAnEarlierRecvIsRefused) {
  const std::string transport = GetParam();
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    constexpr int64_t n = 64;
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(n, true, /*hint_rows=*/8), world));
    // The precondition: Recv pong precedes Send dyn in rank 0's schedule.
    int64_t recv_pong = -1, send_dyn = -1;
    const auto& sched = plan.ranks[0].schedule;
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].transfer < 0) continue;
      const auto& t = plan.transfers[static_cast<size_t>(sched[i].transfer)];
      if (sched[i].kind == graph::OpKind::kRecv && t.tensor == "pong")
        recv_pong = static_cast<int64_t>(i);
      if (sched[i].kind == graph::OpKind::kSend && t.tensor == "dyn")
        send_dyn = static_cast<int64_t>(i);
    }
    RF_ASSERT(recv_pong >= 0 && send_dyn > recv_pong);
    SessionOptions so;
    so.transport = transport;
    so.timeout = kTimeout;
    RF_ASSIGN_OR_FAIL(auto s, create_or_skip(plan, *boot, so, ex));
    for (uint64_t step = 0; step < 3; ++step) {
      RF_ASSERT_OK(s->begin_step(step));
      if (rank == 0) {
        RF_ASSIGN_OR_FAIL(auto pb, s->output_buffer("ping", step, n * 4));
        fill(static_cast<float*>(pb->data), n, step, 1);
        RF_ASSERT_OK(s->send("ping", 1, step));
        RF_ASSIGN_OR_FAIL(auto db, s->output_buffer("dyn", step, 16 * 4));
        fill(static_cast<float*>(db->data), 16, step, 5);
        SendSource src;
        src.dims = {1, 16};
        Status early = s->send("dyn", 1, step, src);
        RF_ASSERT(!early.is_ok());
        RF_ASSERT(contains(early.to_string(), "'dyn'"));
        RF_ASSERT(contains(early.to_string(), "before the recv of"));
        RF_ASSERT(contains(early.to_string(), "'pong'"));
        RF_ASSIGN_OR_FAIL(RecvView v, s->recv("pong", 1, step));
        RF_ASSERT(check(static_cast<const float*>(v.data), n, step, 2));
        RF_ASSERT_OK(s->send("dyn", 1, step, src));
      } else {
        RF_ASSIGN_OR_FAIL(RecvView p, s->recv("ping", 0, step));
        RF_ASSERT(check(static_cast<const float*>(p.data), n, step, 1));
        RF_ASSIGN_OR_FAIL(auto pb, s->output_buffer("pong", step, n * 4));
        fill(static_cast<float*>(pb->data), n, step, 2);
        RF_ASSERT_OK(s->send("pong", 0, step));
        RF_ASSIGN_OR_FAIL(RecvView d, s->recv("dyn", 0, step));
        RF_ASSERT(d.bytes == 16 * 4 && check(static_cast<const float*>(d.data), 16, step, 5));
      }
      RF_ASSERT_OK(s->end_step(step));
    }
    RF_ASSERT_OK(s->finish());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

INSTANTIATE_TEST_SUITE_P(Transports, SessionTransport, ::testing::Values("tcp", "verbs", "grpc"),
                         [](const auto& info) { return info.param; });

// A Recv whose data never comes times out with the transfer, step and peer.
TEST(Session, RecvTimeoutNamesTransferAndPeer) {
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(16), world));
    SessionOptions so;
    so.transport = "tcp";
    so.timeout = 300ms;
    RF_ASSIGN_OR_FAIL(auto s, Session::create(plan, *boot, so));
    if (rank == 1) {
      RF_ASSERT_OK(s->begin_step(0));
      const auto t0 = std::chrono::steady_clock::now();
      auto v = s->recv("ping", 0, 0);  // rank 0 never sends
      const auto waited = std::chrono::steady_clock::now() - t0;
      RF_ASSERT(!v.is_ok());
      const std::string msg = v.status().to_string();
      EXPECT_EQ(v.status().code(), Code::kTimeout) << msg;
      EXPECT_EQ(v.status().peer(), 0) << msg;
      EXPECT_TRUE(contains(msg, "transfer 0 'ping' (rank 0 -> 1)")) << msg;
      EXPECT_TRUE(contains(msg, "step 0")) << msg;
      EXPECT_TRUE(contains(msg, "peer rank 0")) << msg;
      RF_ASSERT(waited >= 250ms && waited < 5s);
      RF_ASSERT_OK(s->end_step(0));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Ranks that hold different plans refuse to start, on every rank.
TEST(Session, PlanHashMismatchIsRefused) {
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange&) -> int {
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(16), world, rank == 0 ? 2 : 3));
    SessionOptions so;
    so.transport = "tcp";
    so.timeout = 5000ms;
    auto s = Session::create(plan, *boot, so);
    RF_ASSERT(!s.is_ok());
    const std::string msg = s.status().to_string();
    EXPECT_TRUE(contains(msg, "runs plan 0x")) << msg;
    EXPECT_TRUE(contains(msg, "same plan")) << msg;
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A RemoteKey over the receiver's RDMAFLOW_MAX_KEY_BYTES (the knob's floor, 32
// bytes, on rank 0 only: a tcp key is 52) comes through the real key exchange of
// Session::create: rank 0 refuses it by its length alone, before parsing it or
// allocating for it, fails naming the knob and rank 1 (so it never writes or
// reads through the key), and rank 1 does not hang: its create, or its first
// receive from the rank that left, fails within the timeout.
TEST(Session, ARemoteKeyOverTheReceiversLimitFailsTheSetupNamingThePeer) {
  const int port = free_port();
  auto r = run_ranks(2, [&](int rank, int world, testing::Exchange& ex) -> int {
    if (rank == 0) ::setenv("RDMAFLOW_MAX_KEY_BYTES", "32", 1);
    RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
    RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(4096), world));
    constexpr auto kSetupTimeout = 5000ms;
    SessionOptions so;
    so.transport = "tcp";
    so.timeout = kSetupTimeout;
    const auto t0 = std::chrono::steady_clock::now();
    auto s = Session::create(plan, *boot, so);
    if (rank == 0) {
      RF_ASSERT(!s.is_ok());
      const std::string msg = s.status().to_string();
      EXPECT_EQ(s.status().code(), Code::kProtocolError) << msg;
      EXPECT_EQ(s.status().peer(), 1) << msg;
      EXPECT_TRUE(contains(msg, "RDMAFLOW_MAX_KEY_BYTES=32")) << msg;
      EXPECT_TRUE(contains(msg, "from rank 1")) << msg;
      RF_ASSERT_OK(ex.barrier());  // rank 1 is done with the store this rank serves
      return 0;
    }
    Status st = s.status();
    if (s.is_ok()) {
      RF_ASSERT_OK((*s)->begin_step(0));
      auto v = (*s)->recv("ping", 0, 0);
      st = v.status();
      RF_ASSERT(!v.is_ok());  // nothing comes from a rank whose setup failed
    }
    EXPECT_FALSE(st.is_ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, kSetupTimeout * 3) << st.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A rank that dies fails its peers' waits with an error naming it, well
// before the timeout.
TEST(Session, DeadPeerFailsWaitsQuickly) {
  const int port = free_port();
  RunOptions ro;
  ro.may_be_killed = {0};
  auto r = run_ranks(
      2,
      [&](int rank, int world, testing::Exchange& ex) -> int {
        RF_ASSIGN_OR_FAIL(auto boot, boot_rank(rank, world, port));
        RF_ASSIGN_OR_FAIL(auto plan, plan_of(ping_pong_graph(16), world));
        SessionOptions so;
        so.transport = "tcp";
        so.timeout = 20000ms;
        RF_ASSIGN_OR_FAIL(auto s, Session::create(plan, *boot, so));
        RF_ASSERT_OK(ex.barrier());
        if (rank == 0) {
          for (;;) std::this_thread::sleep_for(1s);  // killed by rank 1
        }
        RF_ASSERT_OK(ex.kill(0));
        RF_ASSERT_OK(s->begin_step(0));
        const auto t0 = std::chrono::steady_clock::now();
        auto v = s->recv("ping", 0, 0);
        RF_ASSERT(!v.is_ok());
        const std::string msg = v.status().to_string();
        EXPECT_EQ(v.status().peer(), 0) << msg;
        EXPECT_NE(v.status().code(), Code::kTimeout) << msg;
        RF_ASSERT(std::chrono::steady_clock::now() - t0 < 10s);
        RF_ASSERT_OK(s->end_step(0));
        std::fflush(nullptr);
        ::_exit(::testing::Test::HasFailure() ? 1 : 0);  // rank 0's store is gone
      },
      ro);
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow
