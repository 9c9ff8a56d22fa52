#include "runtime/rendezvous/trace_clock.h"

#include <atomic>
#include <charconv>
#include <string>

#include "common/log.h"
#include "common/trace.h"

namespace rdmaflow {

namespace {

constexpr int kRounds = 8;
// Long enough for a rank still starting up, short enough that a rank without
// RDMAFLOW_TRACE costs the others a pause, not the job.
constexpr Millis kPatience{5000};

Bytes number(int64_t v) {
  return to_bytes(std::to_string(v));
}

Result<int64_t> parse_number(const Bytes& b, const std::string& key) {
  const std::string s = as_string(b);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "align trace clock", 0,
                          "'" + key + "' holds '" + s + "', not a clock reading");
  }
  return v;
}

// Rank 0: answers every rank's pings with its clock, rank after rank.
Status serve(Store& store, const std::string& prefix, int world) {
  for (int r = 1; r < world; ++r) {
    for (int i = 0; i < kRounds; ++i) {
      const std::string at = prefix + std::to_string(r) + "/" + std::to_string(i);
      RDMAFLOW_RETURN_IF_ERROR(store.get(at + "/ping", kPatience).status());
      RDMAFLOW_RETURN_IF_ERROR(store.set(at + "/pong", number(trace::now_ns()), kPatience));
    }
  }
  return Status::ok();
}

// Rank r: the offset of the fastest round trip.
Status measure(Store& store, const std::string& prefix, int rank) {
  int64_t best_rtt = -1;
  int64_t best_offset = 0;
  for (int i = 0; i < kRounds; ++i) {
    const std::string at = prefix + std::to_string(rank) + "/" + std::to_string(i);
    const int64_t t0 = trace::now_ns();
    RDMAFLOW_RETURN_IF_ERROR(store.set(at + "/ping", number(t0), kPatience));
    RDMAFLOW_ASSIGN_OR_RETURN(Bytes pong, store.get(at + "/pong", kPatience));
    const int64_t t3 = trace::now_ns();
    RDMAFLOW_ASSIGN_OR_RETURN(int64_t t_root, parse_number(pong, at + "/pong"));
    if (best_rtt < 0 || t3 - t0 < best_rtt) {
      best_rtt = t3 - t0;
      best_offset = t_root - (t0 + (t3 - t0) / 2);
    }
  }
  trace::set_clock_offset(best_offset, best_rtt);
  RDMAFLOW_LOG_INFO("trace clock: offset to rank 0 {} ns (+/- {} ns)", best_offset, best_rtt / 2);
  return Status::ok();
}

}  // namespace

void align_trace_clock(Store& store, int rank, int world) {
  trace::set_rank(rank, world);
  if (world < 2) return;
  // Every rank makes its bootstraps in the same order: the n-th meets the n-th.
  static std::atomic<int> joins{0};
  const std::string prefix = "trace-clock/" + std::to_string(joins.fetch_add(1)) + "/";
  Status st = rank == 0 ? serve(store, prefix, world) : measure(store, prefix, rank);
  if (!st.is_ok()) {
    RDMAFLOW_LOG_WARN(
        "trace clock not aligned with rank 0 ({}); is RDMAFLOW_TRACE set on every "
        "rank? This rank's trace keeps its own clock",
        st.to_string());
  }
}

}  // namespace rdmaflow
