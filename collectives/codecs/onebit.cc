// onebit: 1-bit SGD (Seide et al., Interspeech'14): one sign bit per element,
// reconstructed as the mean of its bucket's positive (or non-positive)
// entries, which is the value per sign group that loses least in squared
// error; what the bits lose stays in the caller's residual and joins the next
// call (error feedback). Buckets (default 512 elements) keep the means local:
// 2 floats per bucket, 1.125 bits per element in all.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/codecs/codec.h"

namespace rdmaflow {
namespace {

// The loops, in SSE2 where the machine has it (every x86-64): GCC at -O2
// vectorized none of them, and 1-bit took 10x longer to encode than fp16.

void add(float* v, const float* x, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4)
    _mm_storeu_ps(v + i, _mm_add_ps(_mm_loadu_ps(v + i), _mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) v[i] += x[i];
}

// The sums of the positive and of the other entries, and how many are positive.
void split_sums(const float* v, size_t n, double* pos, double* other, size_t* npos) {
  size_t i = 0, c = 0;
  double sp = 0, so = 0;
#if defined(__SSE2__)
  __m128 ap = _mm_setzero_ps(), ao = _mm_setzero_ps();
  __m128i ac = _mm_setzero_si128();  // positive lanes (a mask is -1: subtracting counts)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_loadu_ps(v + i), m = _mm_cmpgt_ps(x, zero);
    ap = _mm_add_ps(ap, _mm_and_ps(m, x));
    ao = _mm_add_ps(ao, _mm_andnot_ps(m, x));
    ac = _mm_sub_epi32(ac, _mm_castps_si128(m));
  }
  float lp[4], lo[4];
  int32_t lc[4];
  _mm_storeu_ps(lp, ap);
  _mm_storeu_ps(lo, ao);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lc), ac);
  c = static_cast<size_t>(lc[0]) + lc[1] + lc[2] + lc[3];
  sp = static_cast<double>(lp[0]) + lp[1] + lp[2] + lp[3];
  so = static_cast<double>(lo[0]) + lo[1] + lo[2] + lo[3];
#endif
  for (; i < n; ++i) {
    if (v[i] > 0) {
      sp += v[i];
      ++c;
    } else {
      so += v[i];
    }
  }
  *pos = sp;
  *other = so;
  *npos = c;
}

// bits[i / 8] bit i % 8 = v[i] > 0; with `feedback`, v[i] -= its decoded value.
void signs(float* v, size_t n, float p, float q, uint8_t* bits, bool feedback) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps(), P = _mm_set1_ps(p), Q = _mm_set1_ps(q);
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(v + i), b = _mm_loadu_ps(v + i + 4);
    const __m128 ma = _mm_cmpgt_ps(a, zero), mb = _mm_cmpgt_ps(b, zero);
    bits[i / 8] = static_cast<uint8_t>(_mm_movemask_ps(ma) | (_mm_movemask_ps(mb) << 4));
    if (feedback) {
      _mm_storeu_ps(v + i, _mm_sub_ps(a, _mm_or_ps(_mm_and_ps(ma, P), _mm_andnot_ps(ma, Q))));
      _mm_storeu_ps(v + i + 4, _mm_sub_ps(b, _mm_or_ps(_mm_and_ps(mb, P), _mm_andnot_ps(mb, Q))));
    }
  }
#endif
  for (; i < n; ++i) {
    const bool up = v[i] > 0;
    if (i % 8 == 0) bits[i / 8] = 0;
    bits[i / 8] = static_cast<uint8_t>(bits[i / 8] | (up ? 1u << (i % 8) : 0u));
    if (feedback) v[i] -= up ? p : q;
  }
}

// acc[i] (+)= bit i ? p : q.
template <bool Add>
void expand(const uint8_t* bits, size_t n, float p, float q, float* acc) {
  size_t i = 0;
#if defined(__SSE2__)
  // Lane masks of the 16 nibbles.
  static const auto* nibble = [] {
    auto* t = new __m128i[16];
    for (int k = 0; k < 16; ++k) {
      t[k] = _mm_set_epi32(k & 8 ? -1 : 0, k & 4 ? -1 : 0, k & 2 ? -1 : 0, k & 1 ? -1 : 0);
    }
    return t;
  }();
  const __m128 P = _mm_set1_ps(p), Q = _mm_set1_ps(q);
  for (; i + 8 <= n; i += 8) {
    const uint8_t byte = bits[i / 8];
    const __m128 lo = _mm_castsi128_ps(nibble[byte & 15]), hi = _mm_castsi128_ps(nibble[byte >> 4]);
    __m128 a = _mm_or_ps(_mm_and_ps(lo, P), _mm_andnot_ps(lo, Q));
    __m128 b = _mm_or_ps(_mm_and_ps(hi, P), _mm_andnot_ps(hi, Q));
    if (Add) {
      a = _mm_add_ps(_mm_loadu_ps(acc + i), a);
      b = _mm_add_ps(_mm_loadu_ps(acc + i + 4), b);
    }
    _mm_storeu_ps(acc + i, a);
    _mm_storeu_ps(acc + i + 4, b);
  }
#endif
  for (; i < n; ++i) {
    const float v = ((bits[i / 8] >> (i % 8)) & 1u) ? p : q;
    acc[i] = Add ? acc[i] + v : v;
  }
}

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
    thread_local std::vector<float> copy;  // the bucket's values without a residual
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * bucket_, n = std::min(bucket_, count - begin);
      float* v = residual + begin;
      if (residual != nullptr) {
        add(v, x + begin, n);  // v = x + residual: what this call encodes
      } else {
        copy.assign(x + begin, x + begin + n);
        v = copy.data();
      }
      size_t npos = 0;
      double pos = 0, neg = 0;
      split_sums(v, n, &pos, &neg, &npos);
      const float p = npos > 0 ? static_cast<float>(pos / static_cast<double>(npos)) : 0.0f;
      const float q = n > npos ? static_cast<float>(neg / static_cast<double>(n - npos)) : 0.0f;
      means[2 * b] = p;
      means[2 * b + 1] = q;
      signs(v, n, p, q, bits + begin / 8, residual != nullptr);
    }
  }

  void decode_add(const std::byte* in, size_t count, float* acc) const override {
    expand_all<true>(in, count, acc);
  }
  void decode(const std::byte* in, size_t count, float* out) const override {
    expand_all<false>(in, count, out);
  }

  // Bucket by bucket over the messages: the bucket's floats stay in cache
  // while every message adds to them, one pass over `out` instead of one per
  // message (4 messages of 16 M elements, loaded machine: 28-36 ms against 41-47).
  void decode_sum(const std::byte* in, size_t bytes, int msgs, size_t count,
                  float* out) const override {
    const size_t nb = buckets(count);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * bucket_, n = std::min(bucket_, count - begin);
      for (int j = 0; j < msgs; ++j) {
        const std::byte* msg = in + static_cast<size_t>(j) * bytes;
        const auto* means = reinterpret_cast<const float*>(msg);
        const auto* bits = reinterpret_cast<const uint8_t*>(msg + nb * 8) + begin / 8;
        if (j == 0) {
          expand<false>(bits, n, means[2 * b], means[2 * b + 1], out + begin);
        } else {
          expand<true>(bits, n, means[2 * b], means[2 * b + 1], out + begin);
        }
      }
    }
  }

 private:
  template <bool Add>
  void expand_all(const std::byte* in, size_t count, float* acc) const {
    const size_t nb = buckets(count);
    const auto* means = reinterpret_cast<const float*>(in);
    const auto* bits = reinterpret_cast<const uint8_t*>(in + nb * 8);
    for (size_t b = 0; b < nb; ++b) {
      const size_t begin = b * bucket_, n = std::min(bucket_, count - begin);
      expand<Add>(bits + begin / 8, n, means[2 * b], means[2 * b + 1], acc + begin);
    }
  }

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
