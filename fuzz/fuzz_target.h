// What every fuzz target shares (fuzz/CMakeLists.txt builds them, scripts/fuzz.sh
// runs them; docs/fuzzing.md).
//
// A target defines LLVMFuzzerTestOneInput and `fuzz_seeds()`, named inputs made
// with the project's own encoders; run with FUZZ_WRITE_SEEDS_TO=DIR, the target
// writes them into DIR (scripts/fuzz.sh does before every run), so seeds follow
// the wire formats when they change: only the target's few lines that lay out
// its input need adjusting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fuzz/fuzz_check.h"

namespace rdmaflow::fuzz {

// Consumes the fuzz input front to back; reads past its end fail.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : rest_(data, size) {}
  template <typename T>
  bool take(T& v) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(&v, rest_.data(), sizeof(T));
    rest_ = rest_.subspan(sizeof(T));
    return true;
  }
  // Up to `n` bytes (fewer at the end of the input).
  std::span<const uint8_t> bytes(uint64_t n) {
    const size_t k = n < rest_.size() ? static_cast<size_t>(n) : rest_.size();
    auto out = rest_.first(k);
    rest_ = rest_.subspan(k);
    return out;
  }
  std::span<const uint8_t> rest() { return bytes(rest_.size()); }
  size_t left() const { return rest_.size(); }

 private:
  std::span<const uint8_t> rest_;
};

using Seeds = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

// Appends the bytes of a trivially copyable value (a wire header) to `out`.
template <typename T>
requires std::is_trivially_copyable_v<T>
void append(std::vector<uint8_t>& out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
inline void append(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}

}  // namespace rdmaflow::fuzz

rdmaflow::fuzz::Seeds fuzz_seeds();

// FUZZ_WRITE_SEEDS_TO=DIR: the target writes its seeds into DIR and exits
// (libFuzzer calls this before anything else).
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* dir = std::getenv("FUZZ_WRITE_SEEDS_TO");
  if (dir == nullptr) return 0;
  for (const auto& [name, bytes] : fuzz_seeds()) {
    const std::string path = std::string(dir) + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
        std::fclose(f) != 0) {
      std::perror(path.c_str());
      std::exit(1);
    }
  }
  std::exit(0);
}
