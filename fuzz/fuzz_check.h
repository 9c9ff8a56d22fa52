// The invariant check every fuzz target uses, apart from fuzz_target.h's seed
// machinery so that targets fed by seed files (the graph and ONNX loaders) can
// use it too (docs/fuzzing.md).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace rdmaflow::fuzz {

// A broken invariant: an abort libFuzzer reports as a crash, input kept.
[[noreturn]] inline void bug(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz invariant broken at %s:%d: %s\n", file, line, what);
  std::abort();
}
#define FUZZ_CHECK(cond)                                           \
  do {                                                             \
    if (!(cond)) ::rdmaflow::fuzz::bug(#cond, __FILE__, __LINE__); \
  } while (0)

}  // namespace rdmaflow::fuzz
