// qsgd: QSGD (Alistarh et al., NeurIPS'17): per bucket of 512 elements its L2
// norm, and per element a sign and a level l in [0, s] drawn so that
// E[norm * l / s] = |x|: unbiased, variance bounded by
// min(d / s^2, sqrt(d) / s) * norm^2, so it needs no error feedback. One byte
// per element for s <= 127 (4x fewer bytes than f32).
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/codecs/codec.h"

namespace rdmaflow {
namespace {

constexpr size_t kBucket = 512;  // the paper's bucket size

// The loops in SSE2 where the machine has it (every x86-64): GCC at -O2
// vectorized none of them, and the scalar encoder took 8x longer than fp16's.
// Four xorshift32 streams (seeded from the caller's 64-bit state) draw the
// random bits four elements at a time.
struct Lanes {
  explicit Lanes(uint64_t& rng) {
    uint32_t seed[4];
    for (uint32_t& s : seed) s = static_cast<uint32_t>(codec_random(rng) >> 32) | 1u;
#if defined(__SSE2__)
    state = _mm_loadu_si128(reinterpret_cast<const __m128i*>(seed));
#endif
  }
#if defined(__SSE2__)
  __m128i next() {
    state = _mm_xor_si128(state, _mm_slli_epi32(state, 13));
    state = _mm_xor_si128(state, _mm_srli_epi32(state, 17));
    state = _mm_xor_si128(state, _mm_slli_epi32(state, 5));
    return state;
  }
  __m128i state;
#endif
};

float l2_norm(const float* x, size_t n) {
  size_t i = 0;
  double sq = 0;
#if defined(__SSE2__)
  __m128 acc = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    acc = _mm_add_ps(acc, _mm_mul_ps(v, v));
  }
  float l[4];
  _mm_storeu_ps(l, acc);
  sq = static_cast<double>(l[0]) + l[1] + l[2] + l[3];
#endif
  for (; i < n; ++i) sq += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(std::sqrt(sq));
}

// q[i] = sign(x[i]) * (floor(a) + (u < a - floor(a))), a = min(s, |x[i]| * scale).
void quantize(const float* x, size_t n, float scale, float s, Lanes& lanes, uint64_t& rng,
              int8_t* q) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 vscale = _mm_set1_ps(scale), vs = _mm_set1_ps(s), zero = _mm_setzero_ps();
  const __m128 sign = _mm_set1_ps(-0.0f), unit = _mm_set1_ps(1.0f / 16777216.0f);
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    const __m128 a = _mm_min_ps(vs, _mm_mul_ps(_mm_andnot_ps(sign, v), vscale));
    const __m128i low = _mm_cvttps_epi32(a);  // a >= 0: truncation is floor
    const __m128 u = _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(lanes.next(), 8)), unit);
    const __m128 up = _mm_cmplt_ps(u, _mm_sub_ps(a, _mm_cvtepi32_ps(low)));
    __m128i level = _mm_sub_epi32(low, _mm_castps_si128(up));  // + 1 where up (mask -1)
    const __m128i neg = _mm_castps_si128(_mm_cmplt_ps(v, zero));
    level = _mm_sub_epi32(_mm_xor_si128(level, neg), neg);  // negate where v < 0
    const __m128i packed = _mm_packs_epi16(_mm_packs_epi32(level, level), level);
    const int32_t four = _mm_cvtsi128_si32(packed);
    std::memcpy(q + i, &four, 4);
  }
#endif
  for (; i < n; ++i) {
    const float a = std::min(s, std::fabs(x[i]) * scale);
    const float low = std::floor(a);
    const float u = static_cast<float>(codec_random(rng) >> 40) * (1.0f / 16777216.0f);
    const float level = low + (u < a - low ? 1.0f : 0.0f);
    q[i] = static_cast<int8_t>(x[i] < 0 ? -level : level);
  }
}

template <bool Add>
void dequantize(const int8_t* q, size_t n, float unit, float* acc) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 vu = _mm_set1_ps(unit);
  for (; i + 4 <= n; i += 4) {
    int32_t four;
    std::memcpy(&four, q + i, 4);
    __m128i w = _mm_cvtsi32_si128(four);
    w = _mm_unpacklo_epi8(w, w);
    w = _mm_srai_epi32(_mm_unpacklo_epi16(w, w), 24);  // sign-extended bytes
    const __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(w), vu);
    _mm_storeu_ps(acc + i, Add ? _mm_add_ps(_mm_loadu_ps(acc + i), v) : v);
  }
#endif
  for (; i < n; ++i) acc[i] = (Add ? acc[i] : 0.0f) + unit * static_cast<float>(q[i]);
}

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
    if (rng == 0) rng = 0x9E3779B97F4A7C15ull;  // xorshift's one fixed point
    Lanes lanes(rng);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * kBucket, n = std::min(kBucket, count - begin);
      const float norm = l2_norm(x + begin, n);
      norms[b] = norm;
      quantize(x + begin, n, norm > 0 ? static_cast<float>(levels_) / norm : 0.0f,
               static_cast<float>(levels_), lanes, rng, q + begin);
    }
  }

  void decode_add(const std::byte* in, size_t count, float* acc) const override {
    dequantize_all<true>(in, count, acc);
  }
  void decode(const std::byte* in, size_t count, float* out) const override {
    dequantize_all<false>(in, count, out);
  }

 private:
  template <bool Add>
  void dequantize_all(const std::byte* in, size_t count, float* acc) const {
    const size_t nb = buckets(count);
    const auto* norms = reinterpret_cast<const float*>(in);
    const auto* q = reinterpret_cast<const int8_t*>(in + nb * 4);
    const float inv = 1.0f / static_cast<float>(levels_);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * kBucket, n = std::min(kBucket, count - begin);
      dequantize<Add>(q + begin, n, norms[b] * inv, acc + begin);
    }
  }

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
