// Compressed collectives in real processes over TCP (collectives/compressed.h):
// allreduce with every codec on 2-4 ranks matches a simulation of the route
// with the codec itself to the bit (deterministic codecs) and the exact sum
// within the codec's bound; error feedback across calls; reduce_scatter and
// allgather with the dense codecs; RDMAFLOW_CODEC; refusals that name the
// reason and leave the communicator usable.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>

#include "collectives/compressed.h"
#include "tests/collectives/codec_util.h"
#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

BackendRow tcp() {
  return backend_row("tcp");
}

std::unique_ptr<Codec> make(const CodecSpec& spec) {
  return make_codec(spec).value();
}

// Per element: how far a single compressed allreduce may be from the exact
// sum. Dense codecs round each contribution and the sum once; error-feedback
// codecs are bounded over calls (ErrorFeedbackConverges), not per call.
double dense_bound(const Codec& c, const std::vector<std::vector<float>>& in, size_t i,
                   double exact) {
  double abs_sum = 0;
  for (const auto& x : in) abs_sum += std::fabs(x[i]);
  switch (c.id()) {
    case CodecId::kFp16:
      return (abs_sum + std::fabs(exact)) / 2048 * 1.01 + 1e-6;
    case CodecId::kBf16:
      return (abs_sum + std::fabs(exact)) / 256 * 1.01 + 1e-6;
    case CodecId::kQsgd:  // norm / levels per rounding; |x| <= 8 in a bucket of 512
      return (static_cast<double>(in.size()) + 1) * 8 * std::sqrt(512.0) / 127 * 1.01;
    default:
      return INFINITY;
  }
}

// Every codec at world 2..4, sum and avg, a small and a large count, three
// calls on the same error-feedback state.
TEST(CodecCollectives, AllreduceMatchesSimulationAndBound) {
  for (int world : {2, 3, 4}) {
    auto r = run_ranks(world, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      CommunicatorOptions opts;
      opts.slot_bytes = 64 * 1024;
      RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node, opts));
      for (const auto& row : codec_table()) {
        const CodecSpec spec{row.id, std::nullopt};
        auto codec = make(spec);
        for (size_t count : {size_t{5}, size_t{100003}}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            std::vector<std::vector<float>> in;
            for (int j = 0; j < n; ++j) in.push_back(codec_inputs(j, count, 21));
            std::vector<std::vector<float>> residuals(codec->error_feedback() ? n : 0,
                                                      std::vector<float>(count, 0.0f));
            CodecState state;
            CallOptions o;
            o.codec = spec;
            o.codec_state = &state;
            for (int call = 0; call < 3; ++call) {
              std::vector<float> out(count);
              RF_ASSERT_OK(
                  node.comm->allreduce(in[rank].data(), out.data(), count, DataType::kF32, op, o));
              const std::string what = std::string(row.name) + " world " + std::to_string(n) +
                                       " count " + std::to_string(count) + " " +
                                       std::string(reduce_op_name(op)) + " call " +
                                       std::to_string(call);
              if (row.id != CodecId::kQsgd) {
                auto want = simulate_allreduce(*codec, in, residuals, op == ReduceOp::kAvg);
                size_t diff = 0;
                for (size_t i = 0; i < count; ++i) diff += want[i] != out[i];
                EXPECT_EQ(diff, 0u) << what << ": elements differ from the simulation";
                if (diff) return 1;
              }
              if (codec->error_feedback()) continue;
              for (size_t i = 0; i < count; ++i) {
                double exact = 0;
                for (int j = 0; j < n; ++j) exact += in[j][i];
                double bound = dense_bound(*codec, in, i, exact);
                if (op == ReduceOp::kAvg) {
                  exact /= n;
                  bound /= n;
                }
                if (std::fabs(out[i] - exact) > bound) {
                  ADD_FAILURE() << what << ": element " << i << " is " << out[i] << ", exact "
                                << exact << ", bound " << bound;
                  return 1;
                }
              }
            }
            if (codec->error_feedback()) RF_ASSERT(state.residual.size() == count);
          }
        }
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    RF_EXPECT_RUN_OK(r);
  }
}

// Large dense allreduces run in segments whose encoding and decoding overlap
// the transfers (compressed.cc); per element nothing changes, so the result
// still matches the unsegmented simulation to the bit.
TEST(CodecCollectives, SegmentedDenseAllreduce) {
  for (int world : {2, 3}) {
    auto r = run_ranks(world, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
      const size_t count = (size_t{3} << 20) + 5;  // 3 segments
      std::vector<std::vector<float>> in;
      for (int j = 0; j < n; ++j) in.push_back(codec_inputs(j, count, 31));
      for (const char* text : {"fp16", "bf16"}) {
        CallOptions o;
        o.codec = *parse_codec(text);
        std::vector<float> out(in[rank]);  // in place
        RF_ASSERT_OK(
            node.comm->allreduce(out.data(), out.data(), count, DataType::kF32, ReduceOp::kAvg, o));
        std::vector<std::vector<float>> none;
        const auto want = simulate_allreduce(*make(*o.codec), in, none, true);
        size_t diff = 0;
        for (size_t i = 0; i < count; ++i) diff += want[i] != out[i];
        EXPECT_EQ(diff, 0u) << text << " world " << n;
        if (diff) return 1;
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    RF_EXPECT_RUN_OK(r);
  }
}

// With error feedback nothing is lost across ranks and calls: the outputs of
// T calls on the same inputs sum to T * exact - (sum of the ranks' final
// residuals) / n (avg), so their mean converges to the exact mean (the rate:
// codec_unit_test's ErrorFeedbackLosesNothing).
// Over every backend built here (UCX's same-host pairs take the direct path).
TEST(CodecCollectives, ErrorFeedbackConverges) {
  for (const BackendRow& row : backend_rows()) {
    auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
      CommNode node;
      RF_ASSERT_OK(make_comm_node(row, rank, n, ex, node));
      const size_t count = 20011;
      for (const char* text : {"topk:0.05", "onebit"}) {
        CodecState state;
        CallOptions o;
        o.codec = *parse_codec(text);
        o.codec_state = &state;
        auto x = codec_inputs(rank, count, 5);
        std::vector<double> total(count, 0.0);
        const int calls = 30;
        for (int t = 0; t < calls; ++t) {
          std::vector<float> out(count);
          RF_ASSERT_OK(
              node.comm->allreduce(x.data(), out.data(), count, DataType::kF32, ReduceOp::kAvg, o));
          for (size_t i = 0; i < count; ++i) total[i] += out[i];
        }
        // Every rank's final residual, to check the identity exactly.
        std::vector<float> res_sum(count);
        RF_ASSERT_OK(node.comm->allreduce(state.residual.data(), res_sum.data(), count,
                                          DataType::kF32, ReduceOp::kSum,
                                          CallOptions{.codec = CodecSpec{}}));
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int j = 0; j < n; ++j) exact += codec_input(j, i, 5);
          exact /= n;
          const double identity = calls * exact - res_sum[i] / n;
          if (std::fabs(total[i] - identity) > 2e-3 * calls) {
            ADD_FAILURE() << text << " element " << i << ": outputs sum to " << total[i]
                          << ", inputs minus residuals to " << identity;
            return 1;
          }
        }
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    });
    if (r.skipped) continue;  // a backend not built or not viable here
    EXPECT_TRUE(r.ok) << row.label << ": " << r.message;
  }
}

// reduce_scatter and allgather with the 16-bit codecs, out of place and in place.
TEST(CodecCollectives, ReduceScatterAndAllgatherDense) {
  auto r = run_ranks(3, [&](int rank, int n, Exchange& ex) {
    CommNode node;
    RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
    const size_t count = 3001;
    for (const char* text : {"fp16", "bf16"}) {
      CallOptions o;
      o.codec = *parse_codec(text);
      auto codec = make(*o.codec);
      uint64_t rng = 1;
      // reduce_scatter: block b of every rank's input summed at rank b.
      std::vector<float> in = codec_inputs(rank, count * n, 3), out(count);
      RF_ASSERT_OK(node.comm->reduce_scatter(in.data(), out.data(), count, DataType::kF32,
                                             ReduceOp::kSum, o));
      std::vector<float> want(count, 0.0f);
      for (int j = 0; j < n; ++j) {
        auto x = codec_inputs(j, count * n, 3);
        auto d = round_trip(*codec, x.data() + rank * count, count, nullptr, rng);
        for (size_t i = 0; i < count; ++i) want[i] += d[i];
      }
      RF_ASSERT(want == out);
      // allgather in place: every rank's block decoded, this rank's too.
      std::vector<float> all(count * n);
      auto mine = codec_inputs(rank, count, 4);
      std::copy(mine.begin(), mine.end(), all.begin() + rank * count);
      RF_ASSERT_OK(
          node.comm->allgather(all.data() + rank * count, all.data(), count, DataType::kF32, o));
      for (int j = 0; j < n; ++j) {
        auto x = codec_inputs(j, count, 4);
        auto d = round_trip(*codec, x.data(), count, nullptr, rng);
        RF_ASSERT(std::equal(d.begin(), d.end(), all.begin() + j * count));
      }
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// RDMAFLOW_CODEC applies to f32 sum/avg allreduce without a codec of its own;
// integer allreduce and CodecSpec{} (none) stay exact; a per-call codec wins,
// also in asynchronous calls.
TEST(CodecCollectives, KnobSelectsTheCodec) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    setenv("RDMAFLOW_CODEC", "bf16", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
    const size_t count = 1000;
    std::vector<std::vector<float>> in;
    for (int j = 0; j < n; ++j) in.push_back(codec_inputs(j, count, 8));
    std::vector<float> out(count);
    RF_ASSERT_OK(
        node.comm->allreduce(in[rank].data(), out.data(), count, DataType::kF32, ReduceOp::kSum));
    std::vector<std::vector<float>> none;
    RF_ASSERT(out == simulate_allreduce(*make(*parse_codec("bf16")), in, none, false));
    RF_ASSERT_OK(node.comm->allreduce(in[rank].data(), out.data(), count, DataType::kF32,
                                      ReduceOp::kSum, CallOptions{.codec = CodecSpec{}}));
    for (size_t i = 0; i < count; ++i) RF_ASSERT(out[i] == in[0][i] + in[1][i]);
    std::vector<int32_t> a(count, rank + 1), b(count);
    RF_ASSERT_OK(node.comm->allreduce(a.data(), b.data(), count, DataType::kI32, ReduceOp::kSum));
    RF_ASSERT(b == std::vector<int32_t>(count, 3));
    // Asynchronous, on the lane's worker, with error feedback: twice on one state.
    CodecState state;
    CallOptions o{.codec = *parse_codec("topk:0.1"), .codec_state = &state};
    auto topk = make(*o.codec);
    std::vector<std::vector<float>> residuals(n, std::vector<float>(count, 0.0f));
    for (int call = 0; call < 2; ++call) {
      Request q = node.comm->start_allreduce(in[rank].data(), out.data(), count, DataType::kF32,
                                             ReduceOp::kAvg, o);
      RF_ASSERT_OK(q.wait());
      RF_ASSERT(out == simulate_allreduce(*topk, in, residuals, true));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// A bad knob fails creation; calls a codec cannot serve are refused before
// anything is sent, naming the collective and the reason, and the
// communicator goes on working.
TEST(CodecCollectives, BadCodecUseRefused) {
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    setenv("RDMAFLOW_CODEC", "topk:2", 1);
    {
      CommNode bad;
      Status st = make_comm_node(tcp(), rank, n, ex, bad);
      RF_ASSERT(st.code() == Code::kInvalidArgument);
      RF_ASSERT(st.to_string().find("RDMAFLOW_CODEC='topk:2'") != std::string::npos);
      RF_ASSERT(st.to_string().find("outside (0, 1]") != std::string::npos);
      unsetenv("RDMAFLOW_CODEC");
      RF_ASSERT_OK(ex.barrier());
    }
    CommNode node;
    RF_ASSERT_OK(make_comm_node(tcp(), rank, n, ex, node));
    std::vector<float> f(64, 1.0f), g(128);
    std::vector<int32_t> i(64, 1), j(64);
    auto expect = [&](Status s, const char* want) {
      if (s.code() == Code::kInvalidArgument && s.to_string().find(want) != std::string::npos) {
        return true;
      }
      ADD_FAILURE() << "want an error with '" << want << "', got " << s.to_string();
      return false;
    };
    CallOptions topk{.codec = *parse_codec("topk")};
    CallOptions fp16{.codec = *parse_codec("fp16")};
    RF_ASSERT(
        expect(node.comm->allreduce(i.data(), j.data(), 64, DataType::kI32, ReduceOp::kSum, fp16),
               "codecs encode f32 data, not i32"));
    RF_ASSERT(
        expect(node.comm->allreduce(f.data(), g.data(), 64, DataType::kF32, ReduceOp::kMax, fp16),
               "sum or avg, not max"));
    RF_ASSERT(expect(node.comm->broadcast(f.data(), g.data(), 64, DataType::kF32, 0, fp16),
                     "apply to allreduce, reduce_scatter and allgather only"));
    RF_ASSERT(expect(
        node.comm->reduce_scatter(g.data(), f.data(), 64, DataType::kF32, ReduceOp::kSum, topk),
        "allreduce only"));
    CallOptions bad_param{.codec = CodecSpec{CodecId::kQsgd, 300.0}};
    RF_ASSERT(expect(
        node.comm->allreduce(f.data(), g.data(), 64, DataType::kF32, ReduceOp::kSum, bad_param),
        "levels 300"));
    CodecState state;
    topk.codec_state = &state;
    RF_ASSERT_OK(
        node.comm->allreduce(f.data(), g.data(), 64, DataType::kF32, ReduceOp::kSum, topk));
    RF_ASSERT(
        expect(node.comm->allreduce(g.data(), g.data(), 128, DataType::kF32, ReduceOp::kSum, topk),
               "tensor of 64 elements, this call has 128"));
    RF_ASSERT_OK(
        node.comm->allreduce(f.data(), g.data(), 64, DataType::kF32, ReduceOp::kSum, fp16));
    RF_ASSERT(g[0] == 2.0f);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// The bytes the bench reports: the encodings that cross, per rank.
TEST(CodecCollectives, SentBytes) {
  auto c = make(*parse_codec("fp16"));
  EXPECT_EQ(compressed_sent_bytes(CollectiveKind::kAllreduce, 1 << 20, 4, *c), 2u * 3 * 524288);
  auto t = make(*parse_codec("topk:0.01"));
  EXPECT_EQ(compressed_sent_bytes(CollectiveKind::kAllreduce, 100000, 4, *t), 3u * 1000 * 8);
}

}  // namespace
}  // namespace rdmaflow::testing
