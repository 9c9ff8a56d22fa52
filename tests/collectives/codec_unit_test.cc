// Gradient codecs in one process: every codec's encode/decode round trip and
// its error bound, error feedback that loses nothing, QSGD's unbiasedness,
// and bad codec names and parameters refused with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/collectives/codec_util.h"

namespace rdmaflow::testing {
namespace {

const size_t kCounts[] = {1, 7, 512, 513, 100003, 262147};

std::unique_ptr<Codec> make(const std::string& text) {
  auto spec = parse_codec(text);
  EXPECT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto c = make_codec(*spec);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return std::move(*c);
}

// fp16 and bf16 round each element to nearest: relative error 2^-11, 2^-8.
TEST(Codecs, HalfFloatsRoundToNearest) {
  for (const auto& [name, rel] : {std::pair{"fp16", 1.0 / 2048}, std::pair{"bf16", 1.0 / 256}}) {
    auto c = make(name);
    for (size_t n : kCounts) {
      auto x = codec_inputs(1, n, 3);
      uint64_t rng = 1;
      auto d = round_trip(*c, x.data(), n, nullptr, rng);
      EXPECT_EQ(c->encoded_bytes(n), (2 * n + 7) / 8 * 8);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(d[i] - x[i]), rel * std::fabs(x[i]) + 6e-8)
            << name << " element " << i << " of " << n << ": " << x[i] << " -> " << d[i];
      }
    }
  }
  // bf16 keeps f32's range where fp16 overflows.
  const float big = 1e6f;
  uint64_t rng = 1;
  EXPECT_NEAR(round_trip(*make("bf16"), &big, 1, nullptr, rng)[0], big, big / 256);
  EXPECT_TRUE(std::isinf(round_trip(*make("fp16"), &big, 1, nullptr, rng)[0]));
}

// top-k sends exactly the k largest magnitudes, exactly, and keeps the rest
// in the residual: decoded + new residual == input + old residual.
TEST(Codecs, TopKSendsTheLargestAndKeepsTheRest) {
  for (const char* text : {"topk", "topk:0.1", "topk:1"}) {
    auto c = make(text);
    const double ratio = parse_codec(text)->param.value_or(0.01);
    for (size_t n : kCounts) {
      auto x = codec_inputs(2, n, 5);
      std::vector<float> residual(n);
      for (size_t i = 0; i < n; ++i) residual[i] = 0.01f * codec_input(9, i, 1);
      const auto before = residual;
      uint64_t rng = 1;
      auto d = round_trip(*c, x.data(), n, residual.data(), rng);
      const size_t k = std::clamp<size_t>(static_cast<size_t>(std::ceil(ratio * n)), 1, n);
      ASSERT_EQ(c->encoded_bytes(n), 8 * k);
      size_t sent = 0;
      float smallest_sent = INFINITY, largest_kept = 0;
      for (size_t i = 0; i < n; ++i) {
        const float v = x[i] + before[i];
        if (d[i] != 0) {
          ++sent;
          ASSERT_EQ(d[i], v) << "a sent value is exact";
          ASSERT_EQ(residual[i], 0.0f);
          smallest_sent = std::min(smallest_sent, std::fabs(v));
        } else {
          ASSERT_EQ(residual[i], v) << "what is not sent stays in the residual";
          largest_kept = std::max(largest_kept, std::fabs(v));
        }
      }
      EXPECT_LE(sent, k) << text << " n " << n;
      EXPECT_GE(smallest_sent, largest_kept) << text << " n " << n << ": not the top " << k;
    }
  }
}

// 1-bit: every element decodes to its bucket's mean of its sign group; the
// residual holds the difference (error feedback), so |error| <= the bucket's
// spread.
TEST(Codecs, OneBitDecodesToSignGroupMeans) {
  for (const char* text : {"onebit", "onebit:64"}) {
    auto c = make(text);
    const size_t bucket = static_cast<size_t>(parse_codec(text)->param.value_or(512));
    for (size_t n : kCounts) {
      auto x = codec_inputs(3, n, 7);
      std::vector<float> residual(n, 0.0f);
      uint64_t rng = 1;
      auto d = round_trip(*c, x.data(), n, residual.data(), rng);
      EXPECT_LE(c->encoded_bytes(n), n / 8 + 8 * ((n + bucket - 1) / bucket) + 8);
      for (size_t b = 0; b * bucket < n; ++b) {
        const size_t lo = b * bucket, hi = std::min(n, lo + bucket);
        double pos = 0, neg = 0;
        size_t np = 0;
        float spread = 0;
        for (size_t i = lo; i < hi; ++i) {
          (x[i] > 0 ? pos : neg) += x[i];
          np += x[i] > 0;
          spread = std::max(spread, std::fabs(x[i]));
        }
        for (size_t i = lo; i < hi; ++i) {
          const double want = x[i] > 0 ? pos / np : neg / static_cast<double>(hi - lo - np);
          ASSERT_NEAR(d[i], want, 1e-5 * (1 + std::fabs(want))) << text << " element " << i;
          ASSERT_NEAR(d[i] + residual[i], x[i], 1e-6 * (1 + std::fabs(x[i])));
          ASSERT_LE(std::fabs(d[i] - x[i]), 2 * spread);
        }
      }
    }
  }
}

// Error feedback over many calls: the sum of what was sent plus the last
// residual is the sum of the inputs, so the average sent converges to the
// input with an error of residual / calls. The inputs' outliers (8x, one in
// 97) make 1-bit's residual large (its bucket means follow them), so the
// check is that the error shrinks, not a fixed figure.
TEST(Codecs, ErrorFeedbackLosesNothing) {
  for (const char* text : {"topk:0.05", "onebit"}) {
    auto c = make(text);
    const size_t n = 10007;
    auto x = codec_inputs(4, n, 11);
    std::vector<float> residual(n, 0.0f);
    std::vector<double> sent(n, 0.0);
    uint64_t rng = 1;
    double worst_early = 0;
    const int calls = 2000, early = 100;
    for (int t = 1; t <= calls; ++t) {
      auto d = round_trip(*c, x.data(), n, residual.data(), rng);
      for (size_t i = 0; i < n; ++i) sent[i] += d[i];
      if (t == early) {
        for (size_t i = 0; i < n; ++i) {
          worst_early = std::max(worst_early, std::fabs(sent[i] / t - x[i]));
        }
      }
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sent[i] + residual[i], calls * static_cast<double>(x[i]), 2e-4 * calls)
          << text << " " << i;
      worst = std::max(worst, std::fabs(sent[i] / calls - x[i]));
    }
    EXPECT_LT(worst, worst_early / 4) << text << ": the average sent does not converge";
  }
}

// QSGD: |error| <= norm / levels per element, and the mean of many
// encodings approaches the input (unbiased).
TEST(Codecs, QsgdIsBoundedAndUnbiased) {
  for (const char* text : {"qsgd", "qsgd:4"}) {
    auto c = make(text);
    const double s = parse_codec(text)->param.value_or(127);
    for (size_t n : kCounts) {
      auto x = codec_inputs(5, n, 13);
      uint64_t rng = 42;
      auto d = round_trip(*c, x.data(), n, nullptr, rng);
      EXPECT_EQ(c->encoded_bytes(n), (n + 4 * ((n + 511) / 512) + 7) / 8 * 8);
      for (size_t b = 0; b * 512 < n; ++b) {
        double sq = 0;
        for (size_t i = b * 512; i < std::min(n, b * 512 + 512); ++i) sq += double(x[i]) * x[i];
        const double unit = std::sqrt(sq) / s;
        for (size_t i = b * 512; i < std::min(n, b * 512 + 512); ++i) {
          ASSERT_LE(std::fabs(d[i] - x[i]), unit * (1 + 1e-5)) << text << " element " << i;
        }
      }
    }
    const size_t n = 1024;
    auto x = codec_inputs(6, n, 17);
    std::vector<double> mean(n, 0.0);
    const int draws = 2000;
    uint64_t rng = 7;
    for (int t = 0; t < draws; ++t) {
      auto d = round_trip(*c, x.data(), n, nullptr, rng);
      for (size_t i = 0; i < n; ++i) mean[i] += d[i] / draws;
    }
    double bias = 0;
    for (size_t i = 0; i < n; ++i) bias += mean[i] - x[i];
    // Each draw's error is within +-unit; the mean error of n * draws draws
    // is far below unit / 20 unless the rounding is biased.
    double sq = 0;
    for (size_t i = 0; i < 512; ++i) sq += double(x[i]) * x[i];
    EXPECT_LT(std::fabs(bias / n), std::sqrt(sq) / s / 20) << text << " is biased";
  }
}

// decode() (what the first of a sum's messages uses) writes what zeroing and
// decode_add() would.
TEST(Codecs, DecodeMatchesDecodeAdd) {
  for (const auto& row : codec_table()) {
    auto c = make_codec(CodecSpec{row.id, std::nullopt}).value();
    for (size_t n : kCounts) {
      auto x = codec_inputs(7, n, 19);
      std::vector<std::byte> enc(c->encoded_bytes(n));
      uint64_t rng = 3;
      c->encode(x.data(), n, enc.data(), nullptr, rng);
      std::vector<float> added(n, 0.0f), written(n, 123.0f);
      c->decode_add(enc.data(), n, added.data());
      c->decode(enc.data(), n, written.data());
      ASSERT_EQ(added, written) << row.name << " n " << n;
    }
  }
}

TEST(Codecs, NamesRoundTripThroughText) {
  for (const auto& row : codec_table()) {
    auto spec = parse_codec(row.name);
    ASSERT_TRUE(spec.is_ok());
    EXPECT_EQ(codec_text(*spec), row.name);
    if (!row.alias.empty()) {
      EXPECT_EQ(parse_codec(row.alias)->id, row.id);
    }
    EXPECT_TRUE(make_codec(*spec).is_ok()) << row.name;
  }
  EXPECT_EQ(codec_text(*parse_codec("topk:0.1")), "topk:0.1");
  EXPECT_EQ(parse_codec("none")->id, CodecId::kNone);
}

// Bad names and parameters are refused, naming the codec and what is wrong.
TEST(Codecs, BadParametersRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"zip", "unknown codec 'zip'"},   {"topk:0", "ratio 0"},
      {"topk:1.5", "outside (0, 1]"},   {"topk:-0.1", "outside (0, 1]"},
      {"topk:abc", "is not a number"},  {"topk:", "is not a number"},
      {"qsgd:0", "[1, 127]"},           {"qsgd:128", "[1, 127]"},
      {"qsgd:2.5", "whole number"},     {"onebit:7", "multiple of 8"},
      {"onebit:0", "multiple of 8"},    {"fp16:2", "takes no parameter"},
      {"none:1", "takes no parameter"}, {"topk:nan", "is not a number"},
  };
  for (const auto& [text, want] : cases) {
    auto spec = parse_codec(text);
    Status st = spec.is_ok() ? make_codec(*spec).status() : spec.status();
    ASSERT_FALSE(st.is_ok()) << text << " was accepted";
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << text;
    EXPECT_NE(st.to_string().find(want), std::string::npos) << text << ": " << st.to_string();
  }
}

}  // namespace
}  // namespace rdmaflow::testing
