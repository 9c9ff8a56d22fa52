// Small text helpers shared by the layers' messages.
#pragma once

#include <string>
#include <vector>

namespace rdmaflow {

// "a,b,c" (or with another separator).
inline std::string join(const std::vector<std::string>& parts, const char* sep = ",") {
  std::string out;
  for (const auto& s : parts) out += (out.empty() ? "" : sep) + s;
  return out;
}

// "rank 3", the way every message names a rank.
inline std::string rank_text(int rank) {
  return "rank " + std::to_string(rank);
}

}  // namespace rdmaflow
