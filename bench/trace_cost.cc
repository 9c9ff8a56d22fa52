// What one timeline-trace hook costs (common/trace.h, docs/observability.md):
// the same loop with and without a trace::Span in it, in one run, best of 5
// repetitions each. Run it twice, without and with RDMAFLOW_TRACE, to get the
// cost of a hook with tracing off and on:
//
//   build/bench/trace_cost
//   RDMAFLOW_TRACE=/tmp/trace-cost build/bench/trace_cost
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/trace.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename Body>
double best_ns_per_iter(int64_t n, Body body) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) body(i);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    best = std::min(best, ns / static_cast<double>(n));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2'000'000;
  if (n <= 0) {
    std::fprintf(stderr, "usage: trace_cost [ITERATIONS > 0]\n");
    return 2;
  }
  volatile int64_t sink = 0;
  const double plain = best_ns_per_iter(n, [&](int64_t i) { sink = sink + i; });
  const double span = best_ns_per_iter(n, [&](int64_t i) {
    const rdmaflow::trace::Span s(rdmaflow::trace::kCollective, "send piece",
                                  {.peer = 1, .bytes = i, .step = 2});
    sink = sink + i;
  });
  std::printf(
      "tracing %s: loop %.2f ns/iter, with a Span %.2f ns/iter: %.2f ns per span "
      "(%zu iterations, best of 5)\n",
      rdmaflow::trace::enabled() ? "on" : "off", plain, span, span - plain, static_cast<size_t>(n));
  return 0;
}
