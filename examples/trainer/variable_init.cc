#include "examples/trainer/variable_init.h"

#include <cmath>
#include <string>

namespace rdmaflow::exec {

uint64_t seed_for(std::string_view name, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

Status init_variable(const graph::Op& op, const graph::Shape& shape, uint64_t seed, float* out) {
  std::string init = "glorot";
  double scale = 0.05;
  if (auto it = op.attrs.find("init"); it != op.attrs.end()) {
    if (const auto* s = std::get_if<std::string>(&it->second)) init = *s;
  }
  if (auto it = op.attrs.find("scale"); it != op.attrs.end()) {
    if (const auto* d = std::get_if<double>(&it->second)) scale = *d;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (init == "zeros") {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
    return Status::ok();
  }
  if (init == "glorot") {
    const double fan_in = shape.size() >= 2 ? static_cast<double>(shape[0]) : 0.0;
    const double fan_out = shape.size() >= 2   ? static_cast<double>(shape[1])
                           : shape.size() == 1 ? static_cast<double>(shape[0])
                                               : 1.0;
    scale = std::sqrt(6.0 / std::max(1.0, fan_in + fan_out));
  } else if (init != "uniform") {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "initialize variable '" + op.name + "'", -1,
                          "unknown init '" + init + "' (glorot, zeros, uniform)");
  }
  SplitMix64 rng(seed_for(op.name, seed));
  const auto s = static_cast<float>(scale);
  for (int64_t i = 0; i < n; ++i) out[i] = s * rng.symmetric();
  return Status::ok();
}

}  // namespace rdmaflow::exec
