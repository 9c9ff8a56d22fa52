// onebit: 1-bit SGD (Seide et al., Interspeech'14): one sign bit per element,
// reconstructed as the mean of its bucket's positive (or non-positive)
// entries, which is the value per sign group that loses least in squared
// error; what the bits lose stays in the caller's residual and joins the next
// call (error feedback). Buckets (default 512 elements) keep the means local:
// 2 floats per bucket, 1.125 bits per element in all.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/codecs/codec.h"

namespace rdmaflow {
namespace {

class OneBitCodec final : public Codec {
 public:
  explicit OneBitCodec(size_t bucket) : bucket_(bucket) {}
  CodecId id() const override { return CodecId::kOneBit; }
  CodecSchedule schedule() const override { return CodecSchedule::kAllgather; }
  bool error_feedback() const override { return true; }

  size_t buckets(size_t count) const { return (count + bucket_ - 1) / bucket_; }
  // Per bucket two floats (mean of the positive, of the other entries), then
  // the bits (bucket_ is a multiple of 8: each bucket starts on a byte).
  size_t encoded_bytes(size_t count) const override {
    return (buckets(count) * 8 + (count + 7) / 8 + 7) / 8 * 8;
  }

  void encode(const float* x, size_t count, std::byte* out, float* residual,
              uint64_t&) const override {
    const size_t nb = buckets(count);
    auto* means = reinterpret_cast<float*>(out);
    auto* bits = reinterpret_cast<uint8_t*>(out + nb * 8);
    std::memset(bits, 0, (count + 7) / 8);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * bucket_, n = std::min(bucket_, count - begin);
      float* r = residual != nullptr ? residual + begin : nullptr;
      const float* xb = x + begin;
      auto value = [&](size_t i) { return r != nullptr ? xb[i] + r[i] : xb[i]; };
      double pos = 0, neg = 0;
      size_t npos = 0;
      for (size_t i = 0; i < n; ++i) {
        const float v = value(i);
        if (v > 0) {
          pos += v;
          ++npos;
        } else {
          neg += v;
        }
      }
      const float p = npos > 0 ? static_cast<float>(pos / static_cast<double>(npos)) : 0.0f;
      const float q = n > npos ? static_cast<float>(neg / static_cast<double>(n - npos)) : 0.0f;
      means[2 * b] = p;
      means[2 * b + 1] = q;
      uint8_t* bb = bits + begin / 8;
      for (size_t i = 0; i < n; ++i) {
        const float v = value(i);
        const bool up = v > 0;
        bb[i / 8] = static_cast<uint8_t>(bb[i / 8] | (up ? 1u << (i % 8) : 0u));
        if (r != nullptr) r[i] = v - (up ? p : q);
      }
    }
  }

  void decode_add(const std::byte* in, size_t count, float* acc) const override {
    const size_t nb = buckets(count);
    const auto* means = reinterpret_cast<const float*>(in);
    const auto* bits = reinterpret_cast<const uint8_t*>(in + nb * 8);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * bucket_, n = std::min(bucket_, count - begin);
      const float p = means[2 * b], q = means[2 * b + 1];
      const uint8_t* bb = bits + begin / 8;
      float* a = acc + begin;
      for (size_t i = 0; i < n; ++i) a[i] += ((bb[i / 8] >> (i % 8)) & 1u) ? p : q;
    }
  }

 private:
  size_t bucket_;
};

}  // namespace

Result<std::unique_ptr<Codec>> make_onebit(double bucket) {
  if (!(bucket >= 8 && bucket <= (1 << 24)) || bucket != std::floor(bucket) ||
      static_cast<size_t>(bucket) % 8 != 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "make codec", -1,
                          "codec 'onebit': bucket " + std::to_string(bucket) +
                              " must be a multiple of 8 in [8, 16777216] (elements per "
                              "pair of means, e.g. onebit:512)");
  }
  return std::unique_ptr<Codec>(new OneBitCodec(static_cast<size_t>(bucket)));
}

}  // namespace rdmaflow
