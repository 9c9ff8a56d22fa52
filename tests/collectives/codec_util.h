// Helpers for the codec tests: deterministic inputs and the simulation of a
// compressed collective from every rank's inputs with the codec itself, which
// the real run must match to the bit (the routes of collectives/compressed.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/codecs/codec.h"
#include "collectives/program.h"
#include "collectives/types.h"

namespace rdmaflow::testing {

// Element i of rank r's input for `seed`: a value in [-1, 1), with a few large
// entries so that top-k has something to find.
inline float codec_input(int rank, size_t i, uint32_t seed) {
  uint64_t s = (static_cast<uint64_t>(rank + 1) << 40) ^ (i * 0x9E3779B97F4A7C15ull) ^ seed;
  s = codec_random(s) | 1;
  codec_random(s);
  const float u = static_cast<float>(codec_random(s) >> 40) * (1.0f / 8388608.0f) - 1.0f;
  return i % 97 == static_cast<size_t>(rank) ? 8.0f * u : u;
}

inline std::vector<float> codec_inputs(int rank, size_t count, uint32_t seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = codec_input(rank, i, seed);
  return v;
}

// decode(encode(x)) with `residual` (may be null) and `rng`.
inline std::vector<float> round_trip(const Codec& c, const float* x, size_t n, float* residual,
                                     uint64_t& rng) {
  std::vector<std::byte> enc(c.encoded_bytes(n));
  c.encode(x, n, enc.data(), residual, rng);
  std::vector<float> out(n, 0.0f);
  c.decode_add(enc.data(), n, out.data());
  return out;
}

// The allreduce of inputs[0..world) as run_compressed computes it, for
// deterministic codecs. `residuals` (world entries, or empty: no error
// feedback) are updated as the ranks' states would be.
inline std::vector<float> simulate_allreduce(const Codec& c,
                                             const std::vector<std::vector<float>>& in,
                                             std::vector<std::vector<float>>& residuals, bool avg) {
  const int n = static_cast<int>(in.size());
  const size_t count = in[0].size();
  std::vector<float> out(count, 0.0f);
  uint64_t rng = 1;
  const float inv = 1.0f / static_cast<float>(n);
  if (c.schedule() == CodecSchedule::kAllgather) {
    for (int j = 0; j < n; ++j) {
      float* r = residuals.empty() ? nullptr : residuals[j].data();
      const auto d = round_trip(c, in[j].data(), count, r, rng);
      for (size_t i = 0; i < count; ++i) out[i] += d[i];
    }
    if (avg) {
      for (auto& v : out) v *= inv;
    }
    return out;
  }
  for (int b = 0; b < n; ++b) {
    const BlockRange br = block_range(count, n, b);
    std::vector<float> acc(br.size, 0.0f);
    for (int j = 0; j < n; ++j) {
      const auto d = round_trip(c, in[j].data() + br.begin, br.size, nullptr, rng);
      for (size_t i = 0; i < br.size; ++i) acc[i] += d[i];
    }
    if (avg) {
      for (auto& v : acc) v *= inv;
    }
    const auto d = round_trip(c, acc.data(), br.size, nullptr, rng);
    std::memcpy(out.data() + br.begin, d.data(), br.size * 4);
  }
  return out;
}

}  // namespace rdmaflow::testing
