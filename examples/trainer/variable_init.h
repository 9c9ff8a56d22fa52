// Initial values of Variable ops, reproducible on any rank: a function of the
// op's name, its shape, its "init" attribute and a seed only, so a variable
// starts identical whichever rank holds it and however the graph is placed.
//
//   "init": "glorot" (default)  uniform in +-sqrt(6 / (fan_in + fan_out)),
//                               fan_in = dims[0], fan_out = dims[1] (a vector: 0, dims[0])
//           "zeros"             all zero
//           "uniform"           uniform in +-"scale" (default 0.05)
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "graph/ir.h"

namespace rdmaflow::exec {

// A small, fast, seedable generator (SplitMix64) used for variables and
// synthetic data; the same sequence on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
  // Roughly standard normal (sum of four uniforms, scaled).
  float normal() { return (symmetric() + symmetric() + symmetric() + symmetric()) * 0.8660254f; }

 private:
  uint64_t state_;
};

// A seed mixed from a name: stable across runs and ranks.
uint64_t seed_for(std::string_view name, uint64_t seed);

// Fills `out` (elements of `shape`) with the initial value of Variable `op`.
Status init_variable(const graph::Op& op, const graph::Shape& shape, uint64_t seed, float* out);

}  // namespace rdmaflow::exec
