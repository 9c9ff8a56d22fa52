// Channel operations in the timeline trace (common/trace.h): each backend's
// write(), read() and send_message() start with
//
//   trace_op(done, "write", *this, len);
//
// which, with tracing on, wraps the callback so that the operation's span runs
// from issue to completion (an async span: it ends on the progress thread).
// With tracing off it is one branch and leaves `done` alone.
#pragma once

#include <string>

#include "common/trace.h"
#include "transport/channel.h"

namespace rdmaflow {

// The wrapped callback. attach_wait_driver() looks through it, so a traced
// Completion still lets its waiter drive the backend's progress.
struct TracedOp {
  Callback inner;
  const char* op;
  std::string transport;
  int peer;
  size_t bytes;
  int64_t start_ns;

  void operator()(const Status& st) const;
};

void wrap_traced(Callback& done, const char* op, const Channel& channel, size_t bytes);

inline void trace_op(Callback& done, const char* op, const Channel& channel, size_t bytes) {
  if (trace::enabled()) wrap_traced(done, op, channel, bytes);
}

}  // namespace rdmaflow
