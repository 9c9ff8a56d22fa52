// alltoallv and point-to-point send/recv in real processes over real channels
// (TCP, and UCX when built and viable): uneven and empty blocks, counts that
// do not match across ranks, bad layouts, a ring of sends and receives larger
// than a lane's slots, and a message whose size or tag differs from the recv's.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

class Alltoallv : public ::testing::TestWithParam<BackendRow> {
 protected:
  const BackendRow& backend() const { return GetParam(); }
};

// Elements rank `from` sends rank `to` in round `k`: uneven, some empty.
size_t block(int from, int to, int k) {
  return static_cast<size_t>((from * 3 + to * 5 + k) % 7) * (k == 2 ? 1000 : 1);
}

int32_t value(int from, int to, size_t i) {
  return from * 1000000 + to * 10000 + static_cast<int32_t>(i);
}

// A layout of rank `rank`'s blocks in round k, packed in peer order (the
// receive side in reverse order, so displacements are not the send side's).
AlltoallvLayout layout_of(int rank, int n, int k) {
  AlltoallvLayout l;
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    l.send_counts.push_back(block(rank, p, k));
    l.send_displs.push_back(at);
    at += l.send_counts.back();
  }
  l.recv_counts.assign(n, 0);
  l.recv_displs.assign(n, 0);
  at = 0;
  for (int p = n - 1; p >= 0; --p) {
    l.recv_counts[p] = block(p, rank, k);
    l.recv_displs[p] = at;
    at += l.recv_counts[p];
  }
  return l;
}

size_t total(const std::vector<size_t>& v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

TEST_P(Alltoallv, UnevenBlocksArriveWhereTheLayoutSays) {
  for (int world : {1, 2, 3, 4}) {
    auto r = run_ranks(world, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      CommunicatorOptions opts;
      opts.slot_bytes = 4096;  // the 1000x round crosses many pieces and reuses slots
      opts.slots = 2;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, opts));
      for (int k = 0; k < 3; ++k) {
        const AlltoallvLayout l = layout_of(rank, n, k);
        std::vector<int32_t> in(total(l.send_counts)), out(total(l.recv_counts) + 1, -1);
        for (int p = 0; p < n; ++p) {
          for (size_t i = 0; i < l.send_counts[p]; ++i) {
            in[l.send_displs[p] + i] = value(rank, p, i);
          }
        }
        if (k == 1) {
          RF_ASSERT_OK(
              node.comm
                  ->start_alltoallv(in.data(), in.size(), out.data(), out.size(), l, DataType::kI32)
                  .wait());
        } else {
          RF_ASSERT_OK(node.comm->alltoallv(in.data(), in.size(), out.data(), out.size(), l,
                                            DataType::kI32));
        }
        size_t wrong = 0;
        for (int p = 0; p < n; ++p) {
          for (size_t i = 0; i < l.recv_counts[p]; ++i) {
            wrong += out[l.recv_displs[p] + i] != value(p, rank, i);
          }
        }
        EXPECT_EQ(wrong, 0u) << "rank " << rank << " of " << n << ", round " << k;
        EXPECT_EQ(out.back(), -1) << "written past the layout";
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << "world " << world << ": " << r.message;
  }
}

// Rank 1 expects one element more from rank 0 than rank 0 sends: both fail
// with an error naming the other, rank 2 (whose pairs agree) succeeds, and
// the next call works everywhere.
TEST_P(Alltoallv, MismatchedCountsFailBothSidesAndLeaveTheCommunicatorUsable) {
  auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    AlltoallvLayout l = layout_of(rank, n, 0);
    if (rank == 1) ++l.recv_counts[0];
    std::vector<int32_t> in(total(l.send_counts) + 1), out(total(l.recv_counts) + 8);
    if (rank == 1) {  // the extra element's place: after every other block
      l.recv_displs[0] = total(l.recv_counts);
    }
    Status st =
        node.comm->alltoallv(in.data(), in.size(), out.data(), out.size(), l, DataType::kI32);
    if (rank == 2) {
      RF_ASSERT_OK(st);
    } else {
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
      EXPECT_EQ(st.peer(), 1 - rank) << st.to_string();
      EXPECT_NE(st.to_string().find("alltoallv"), std::string::npos) << st.to_string();
    }
    float x = 1, y = 0;
    RF_ASSERT_OK(node.comm->allreduce(&x, &y, 1, DataType::kF32, ReduceOp::kSum));
    EXPECT_EQ(y, 3.0f);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

TEST_P(Alltoallv, BadLayoutsAreRefused) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    std::vector<int32_t> in(8), out(8);
    auto refused = [&](AlltoallvLayout l, const void* src, void* dst, const char* what) {
      Status st = node.comm->alltoallv(src, 8, dst, 8, l, DataType::kI32);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << what << ": " << st.to_string();
    };
    const AlltoallvLayout good{{2, 2}, {0, 2}, {2, 2}, {0, 2}};
    AlltoallvLayout l = good;
    l.send_counts.pop_back();
    refused(l, in.data(), out.data(), "short layout");
    l = good;
    l.send_displs[1] = 7;
    refused(l, in.data(), out.data(), "block past the input");
    l = good;
    l.recv_displs[1] = SIZE_MAX;
    refused(l, in.data(), out.data(), "overflowing displacement");
    l = good;
    l.recv_displs[1] = 1;
    refused(l, in.data(), out.data(), "overlapping blocks");
    l = good;
    l.send_counts[rank] = 1;
    refused(l, in.data(), out.data(), "self block of two sizes");
    refused(good, in.data(), in.data(), "in place");
    refused(good, nullptr, out.data(), "null input");
    RF_ASSERT_OK(node.comm->alltoallv(in.data(), 8, out.data(), 8, good, DataType::kI32));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

// Every rank sends to the next and receives from the previous at once, with
// messages far larger than the p2p lane's slots (each direction of a pair
// must run on its own), then small ones.
TEST_P(Alltoallv, SendRecvRingLargerThanTheSlots) {
  for (int world : {2, 3}) {
    auto r = run_ranks(world, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      CommunicatorOptions opts;
      opts.p2p = true;
      opts.slot_bytes = 8192;
      opts.slots = 2;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, opts));
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      for (size_t count : {size_t{100000}, size_t{3}, size_t{0}}) {
        std::vector<int32_t> out(count), in(count + 1, -1);
        for (size_t i = 0; i < count; ++i) out[i] = value(rank, next, i);
        Request s = node.comm->start_send(out.data(), count, DataType::kI32, next, 7);
        Request q = node.comm->start_recv(in.data(), count, DataType::kI32, prev, 7);
        RF_ASSERT_OK(q.wait());
        RF_ASSERT_OK(s.wait());
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += in[i] != value(prev, rank, i);
        EXPECT_EQ(wrong, 0u) << "count " << count;
        EXPECT_EQ(in.back(), -1);
      }
      // Collectives still run beside the p2p lane.
      float x = 1, y = 0;
      RF_ASSERT_OK(node.comm->allreduce(&x, &y, 1, DataType::kF32, ReduceOp::kSum));
      EXPECT_EQ(y, static_cast<float>(n));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) GTEST_SKIP() << r.message;
    ASSERT_TRUE(r.ok) << "world " << world << ": " << r.message;
  }
}

// A recv whose size or tag differs from the next message fails naming both,
// consumes that message, and the following pair of calls works; without
// CommunicatorOptions::p2p, and toward this rank itself, send is refused.
TEST_P(Alltoallv, SendRecvMismatchAndRefusals) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    CommunicatorOptions opts;
    opts.p2p = true;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node, opts));
    std::vector<float> buf(64, static_cast<float>(rank + 1));
    const int other = 1 - rank;
    if (rank == 0) {
      RF_ASSERT_OK(node.comm->send(buf.data(), 64, DataType::kF32, other, 1));
      RF_ASSERT_OK(node.comm->send(buf.data(), 64, DataType::kF32, other, 2));
      RF_ASSERT_OK(node.comm->send(buf.data(), 64, DataType::kF32, other, 3));
    } else {
      Status st = node.comm->recv(buf.data(), 32, DataType::kF32, other, 1);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.to_string().find("256 bytes with tag 1"), std::string::npos) << st.to_string();
      st = node.comm->recv(buf.data(), 64, DataType::kF32, other, 9);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.to_string().find("tag 2"), std::string::npos) << st.to_string();
      RF_ASSERT_OK(node.comm->recv(buf.data(), 64, DataType::kF32, other, 3));
      EXPECT_EQ(buf[63], 1.0f);
    }
    EXPECT_EQ(node.comm->send(buf.data(), 1, DataType::kF32, rank).code(), Code::kInvalidArgument);
    EXPECT_EQ(node.comm->send(buf.data(), 1, DataType::kF32, 5).code(), Code::kInvalidArgument);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
  auto plain = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    float x = 0;
    Status st = node.comm->send(&x, 1, DataType::kF32, 1 - rank);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("p2p"), std::string::npos) << st.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (plain.skipped) GTEST_SKIP() << plain.message;
  ASSERT_TRUE(plain.ok) << plain.message;
}

INSTANTIATE_TEST_SUITE_P(Backends, Alltoallv, ::testing::ValuesIn(backend_rows()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace rdmaflow::testing
