#include "graph/hash.h"

namespace rdmaflow::graph {

std::string hash_hex(uint64_t h) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x0000000000000000";
  for (int i = 17; i >= 2; --i, h >>= 4) s[static_cast<size_t>(i)] = kDigits[h & 0xf];
  return s;
}

}  // namespace rdmaflow::graph
