// The shared shape of the 16-bit float codecs (fp16.cc, bf16.cc): each element
// rounded once to a 16-bit float, widened back to f32 to be summed. Only the
// two conversions differ.
#pragma once

#include <cstdint>
#include <memory>

#include "collectives/codecs/codec.h"

namespace rdmaflow {

// to_narrow: out[i] = round(x[i]); add_wide: acc[i] += widen(in[i]);
// to_wide: out[i] = widen(in[i]).
template <CodecId Id, void (*ToNarrow)(const float*, size_t, uint16_t*),
          void (*AddWide)(const uint16_t*, size_t, float*),
          void (*ToWide)(const uint16_t*, size_t, float*)>
class NarrowFloatCodec final : public Codec {
 public:
  CodecId id() const override { return Id; }
  CodecSchedule schedule() const override { return CodecSchedule::kReduceScatterAllgather; }
  // Rounded up to 8 bytes: the blocks of an alltoall stay aligned for every codec.
  size_t encoded_bytes(size_t count) const override { return (count * 2 + 7) / 8 * 8; }
  void encode(const float* x, size_t count, std::byte* out, float*, uint64_t&) const override {
    ToNarrow(x, count, reinterpret_cast<uint16_t*>(out));
  }
  void decode_add(const std::byte* in, size_t count, float* acc) const override {
    AddWide(reinterpret_cast<const uint16_t*>(in), count, acc);
  }
  void decode(const std::byte* in, size_t count, float* out) const override {
    ToWide(reinterpret_cast<const uint16_t*>(in), count, out);
  }
};

// Codecs without a parameter refuse one.
Result<std::unique_ptr<Codec>> refuse_param(const char* codec, double param);

}  // namespace rdmaflow
