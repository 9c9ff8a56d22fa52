// What the Session puts in the timeline trace (common/trace.h): a span per
// step (begin_step to end_step) and per send and recv of a planned transfer,
// naming the tensor, the peer and the bytes; the channel operations under
// them come from the backends.
#pragma once

#include <cstdint>

#include "common/trace.h"
#include "graph/transfer_plan.h"

namespace rdmaflow {

inline trace::Args transfer_args(const graph::TransferSpec& spec, uint64_t step, uint64_t bytes,
                                 bool outgoing) {
  return {.peer = outgoing ? spec.dst_rank : spec.src_rank,
          .bytes = static_cast<int64_t>(bytes),
          .step = static_cast<int64_t>(step),
          .label_key = "tensor",
          .label = spec.tensor};
}

}  // namespace rdmaflow
