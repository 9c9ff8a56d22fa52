#include "transport/channel_trace.h"

#include <string>

namespace rdmaflow {

void TracedOp::operator()(const Status& st) const {
  trace::Args args{.peer = peer,
                   .bytes = static_cast<int64_t>(bytes),
                   .label_key = "transport",
                   .label = transport};
  const std::string name = st.is_ok() ? std::string(op) : std::string(op) + " (failed)";
  trace::record(trace::kChannel, name, start_ns, trace::now_ns(), args, /*async=*/true);
  if (!st.is_ok()) trace::flush_on_error();
  inner(st);
}

void wrap_traced(Callback& done, const char* op, const Channel& channel, size_t bytes) {
  if (!done) return;
  done =
      TracedOp{std::move(done), op, channel.backend(), channel.peer_rank(), bytes, trace::now_ns()};
}

}  // namespace rdmaflow
