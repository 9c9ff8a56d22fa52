// qsgd: QSGD (Alistarh et al., NeurIPS'17): per bucket of 512 elements its L2
// norm, and per element a sign and a level l in [0, s] drawn so that
// E[norm * l / s] = |x|: unbiased, variance bounded by
// min(d / s^2, sqrt(d) / s) * norm^2, so it needs no error feedback. One byte
// per element for s <= 127 (4x fewer bytes than f32).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/codecs/codec.h"

namespace rdmaflow {
namespace {

constexpr size_t kBucket = 512;  // the paper's bucket size

class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(int levels) : levels_(levels) {}
  CodecId id() const override { return CodecId::kQsgd; }
  CodecSchedule schedule() const override { return CodecSchedule::kReduceScatterAllgather; }

  static size_t buckets(size_t count) { return (count + kBucket - 1) / kBucket; }
  // Per bucket its norm (f32), then one signed level per element.
  size_t encoded_bytes(size_t count) const override {
    return (buckets(count) * 4 + count + 7) / 8 * 8;
  }

  void encode(const float* x, size_t count, std::byte* out, float*, uint64_t& rng) const override {
    const size_t nb = buckets(count);
    auto* norms = reinterpret_cast<float*>(out);
    auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
    const float s = static_cast<float>(levels_);
    if (rng == 0) rng = 0x9E3779B97F4A7C15ull;  // xorshift's one fixed point
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * kBucket, n = std::min(kBucket, count - begin);
      double sq = 0;
      for (size_t i = 0; i < n; ++i) sq += static_cast<double>(x[begin + i]) * x[begin + i];
      const float norm = static_cast<float>(std::sqrt(sq));
      norms[b] = norm;
      const float scale = norm > 0 ? s / norm : 0.0f;
      for (size_t i = 0; i < n; ++i) {
        const float v = x[begin + i];
        const float a = std::min(s, std::fabs(v) * scale);
        const float low = std::floor(a);
        // 24 random bits as a uniform in [0, 1).
        const float u = static_cast<float>(codec_random(rng) >> 40) * (1.0f / 16777216.0f);
        const float level = low + (u < a - low ? 1.0f : 0.0f);
        q[begin + i] = static_cast<int8_t>(v < 0 ? -level : level);
      }
    }
  }

  void decode_add(const std::byte* in, size_t count, float* acc) const override {
    const size_t nb = buckets(count);
    const auto* norms = reinterpret_cast<const float*>(in);
    const auto* q = reinterpret_cast<const int8_t*>(in + nb * 4);
    const float inv = 1.0f / static_cast<float>(levels_);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * kBucket, n = std::min(kBucket, count - begin);
      const float unit = norms[b] * inv;
      for (size_t i = 0; i < n; ++i) acc[begin + i] += unit * static_cast<float>(q[begin + i]);
    }
  }

 private:
  int levels_;
};

}  // namespace

Result<std::unique_ptr<Codec>> make_qsgd(double levels) {
  if (!(levels >= 1 && levels <= 127) || levels != std::floor(levels)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "make codec", -1,
                          "codec 'qsgd': levels " + std::to_string(levels) +
                              " must be a whole number in [1, 127] (quantization levels per "
                              "sign, one byte per element, e.g. qsgd:127)");
  }
  return std::unique_ptr<Codec>(new QsgdCodec(static_cast<int>(levels)));
}

}  // namespace rdmaflow
