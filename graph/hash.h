// 64-bit FNV-1a: a stable, dependency-free hash for plans and graphs that
// ranks exchange at setup to check they agree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rdmaflow::graph {

constexpr uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Incremental FNV-1a. Each add() also mixes in a separator so that
// ("ab", "c") and ("a", "bc") hash differently.
class Fnv1a {
 public:
  void add(std::string_view bytes) {
    for (char c : bytes) mix(static_cast<uint8_t>(c));
    mix(0xff);
  }
  void add_u64(uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) mix(static_cast<uint8_t>(v));
  }
  uint64_t value() const { return h_; }

 private:
  void mix(uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ull;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// "0x" followed by 16 lowercase hex digits.
std::string hash_hex(uint64_t h);

}  // namespace rdmaflow::graph
