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

// "0x" followed by 16 lowercase hex digits.
std::string hash_hex(uint64_t h);

}  // namespace rdmaflow::graph
