// bf16: the upper half of an f32, rounded to nearest even (the rounding
// Eigen, TPUs and torch use): f32's range with 8 bits of mantissa, so no
// overflow where fp16 would give infinity, at 3 fewer bits of precision.
#include <cstring>

#include "collectives/codecs/narrow_float.h"

namespace rdmaflow {
namespace {

// Plain loops over bits: the compiler vectorizes them.
void to_bf16(const float* x, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    out[i] = static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
  }
}

void add_bf16(const uint16_t* in, size_t n, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    acc[i] += f;
  }
}

}  // namespace

Result<std::unique_ptr<Codec>> make_bf16(double param) {
  RDMAFLOW_RETURN_IF_ERROR(refuse_param("bf16", param).status());
  return std::unique_ptr<Codec>(new NarrowFloatCodec<CodecId::kBf16, to_bf16, add_bf16>());
}

}  // namespace rdmaflow
