// fp16: IEEE half precision on the wire (Micikevicius et al., "Mixed Precision
// Training"; Horovod's Compression.fp16). Values round to nearest even;
// beyond 65504 they become infinity, so callers with large gradients pick
// bf16 (f32's range). Where the CPU has F16C the conversions are one
// instruction per 8 elements; elsewhere Eigen::half's portable code.
#include <immintrin.h>

#include <Eigen/Core>
#include <cstring>

#include "collectives/codecs/narrow_float.h"

namespace rdmaflow {
namespace {

bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

__attribute__((target("avx,f16c"))) void to_half_f16c(const float* x, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = Eigen::numext::bit_cast<uint16_t>(Eigen::half(x[i]));
}

__attribute__((target("avx,f16c"))) void add_half_f16c(const uint16_t* in, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
  }
  for (; i < n; ++i) acc[i] += static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(in[i]));
}

__attribute__((target("avx,f16c"))) void from_half_f16c(const uint16_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(in[i]));
}

void from_half(const uint16_t* in, size_t n, float* out) {
  if (have_f16c()) return from_half_f16c(in, n, out);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(in[i]));
  }
}

void to_half(const float* x, size_t n, uint16_t* out) {
  if (have_f16c()) return to_half_f16c(x, n, out);
  for (size_t i = 0; i < n; ++i) out[i] = Eigen::numext::bit_cast<uint16_t>(Eigen::half(x[i]));
}

void add_half(const uint16_t* in, size_t n, float* acc) {
  if (have_f16c()) return add_half_f16c(in, n, acc);
  for (size_t i = 0; i < n; ++i) {
    acc[i] += static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(in[i]));
  }
}

}  // namespace

Result<std::unique_ptr<Codec>> refuse_param(const char* codec, double param) {
  if (param != 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "make codec", -1,
                          std::string("codec '") + codec + "' takes no parameter (got " +
                              std::to_string(param) + ")");
  }
  return std::unique_ptr<Codec>();
}

Result<std::unique_ptr<Codec>> make_fp16(double param) {
  RDMAFLOW_RETURN_IF_ERROR(refuse_param("fp16", param).status());
  return std::unique_ptr<Codec>(
      new NarrowFloatCodec<CodecId::kFp16, to_half, add_half, from_half>());
}

}  // namespace rdmaflow
