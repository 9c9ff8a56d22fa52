// Timeline trace: RDMAFLOW_TRACE=DIR makes this process write
// DIR/rdmaflow-trace-rank<R>-pid<P>.json, a Chrome trace-event file that
// Perfetto (ui.perfetto.dev) and chrome://tracing load; scripts/trace-merge.py
// merges a job's files into one timeline (docs/observability.md).
//
// Hooks are one line at the call site:
//
//   const trace::Span span(trace::kCollective, "allreduce", {.peer = -1, .bytes = n});
//
// With tracing off, a hook costs one branch on a bool read once at start-up
// (and the small Args built from values at hand); nothing is allocated, copied
// or formatted. With it on, a finished span is
// copied into a ring buffer of RDMAFLOW_TRACE_EVENTS entries (default 1<<18,
// 160 bytes each) under a short lock; when it is full the oldest events are
// dropped and counted, so memory stays bounded however long the job runs. The
// buffer is written at exit (atexit), on errors (flush_on_error(), at most once
// a second) and by flush().
//
// Timestamps are the steady clock shifted by the offset that bootstrap
// measured against rank 0 (set_clock_offset), so every rank's file is already
// in rank 0's clock and merged files line up.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rdmaflow::trace {

namespace detail {
// Read once from RDMAFLOW_TRACE before main(); never changes afterwards.
extern bool g_enabled;
}  // namespace detail

inline bool enabled() {
  return __builtin_expect(detail::g_enabled, 0);
}

// Categories (the "cat" field), static strings.
inline constexpr const char* kChannel = "channel";        // write, read, message (async)
inline constexpr const char* kCollective = "collective";  // one call, its program, its pieces
inline constexpr const char* kSession = "session";        // steps, sends, recvs
inline constexpr const char* kOp = "op";                  // the reference executor's ops

// What a span carries besides its name; unset fields are left out of the file.
struct Args {
  int peer = -1;
  int64_t bytes = -1;
  int64_t step = -1;
  // One named text field: "transport", "algorithm", "tensor", "type", ...
  const char* label_key = nullptr;
  std::string_view label;
  int64_t peers = -1;  // collectives: ranks taking part
};

// Steady clock in nanoseconds (this process's own clock, not yet shifted).
int64_t now_ns();

// Records a finished span [start_ns, end_ns). `async`: an operation that
// completes on another thread (channel operations), written as a b/e pair
// with its own id; otherwise a complete ("X") event on the calling thread.
void record(const char* cat, std::string_view name, int64_t start_ns, int64_t end_ns,
            const Args& args, bool async = false);

// For spans that do not fit a scope (a step from begin_step to end_step):
// stamp() at the start (0 with tracing off), finish() at the end.
inline int64_t stamp() {
  return enabled() ? now_ns() : 0;
}
inline void finish(const char* cat, std::string_view name, int64_t start_ns, const Args& args) {
  if (enabled()) record(cat, name, start_ns, now_ns(), args);
}

// A span from construction to destruction on the calling thread.
class Span {
 public:
  Span(const char* cat, std::string_view name, const Args& args = {}) {
    if (enabled()) begin(cat, name, args);
  }
  ~Span() {
    if (open_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(const char* cat, std::string_view name, const Args& args);
  void end();

  // This thread's slot for the span (trace.cc), holding copies of what begin()
  // saw; null with tracing off, the only state then.
  void* open_ = nullptr;
};

// This process's rank and world (bootstrap), for the file name and metadata.
void set_rank(int rank, int world);
// local steady clock + offset_ns = rank 0's steady clock; rtt_ns is the
// round trip of the best of the exchanges (the offset's uncertainty).
void set_clock_offset(int64_t offset_ns, int64_t rtt_ns);

// Writes the buffer to the file now (replacing an earlier write).
void flush();
// flush() after a failure (a channel operation that completed with an error, a
// failed collective, abort), at most once a second so that an error storm does
// not become an I/O storm.
void flush_on_error();

// The file this process writes ("" when tracing is off).
std::string file_path();

}  // namespace rdmaflow::trace
