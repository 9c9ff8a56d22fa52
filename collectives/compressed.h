// Compressed collectives: allreduce, reduce_scatter and allgather of f32 data
// whose bytes travel encoded by a gradient codec (collectives/codecs/codec.h,
// docs/compression.md). The communicator runs them on a call's lane when
// CallOptions::codec or RDMAFLOW_CODEC asks for a codec.
//
// They are compositions of the byte collectives the algorithm table already
// has, not new algorithms: encoded blocks move by alltoall (pairwise) and
// allgather (the cost model's choice), and the decoding, the f32 sums and the
// error feedback run here between those phases. See CodecSchedule for which
// codec takes which route.
#pragma once

#include <chrono>
#include <string>

#include "collectives/algorithms/registry.h"
#include "collectives/codecs/codec.h"
#include "collectives/fabric.h"
#include "common/status.h"

namespace rdmaflow {

// A call's codec, as the communicator resolved it.
struct CodecCall {
  std::shared_ptr<const Codec> codec;
  CodecSpec spec;
  CodecState* state = nullptr;  // the caller's; null: no error feedback
  uint64_t seed = 1;            // stochastic codecs without a state
};

// Whether a `kind` call of `count` elements of `type` with `op` can use
// `codec` (and `state`); the error names the collective and the reason.
Status check_codec_call(CollectiveKind kind, size_t count, DataType type, ReduceOp op,
                        const CodecCall& call);

// Runs `args` (f32; allreduce, reduce_scatter or allgather, already checked)
// with the codec on `lane` before `deadline`. `what` names it in errors.
Status run_compressed(Fabric& fabric, const CollArgs& args, const CodecCall& codec, int lane,
                      std::chrono::steady_clock::time_point deadline, const std::string& what);

// Payload bytes one rank sends for such a call (what the bench prints as the
// bytes on the wire): 2 (n-1) encoded blocks for the alltoall + allgather
// route, n-1 encoded tensors for the allgather route.
size_t compressed_sent_bytes(CollectiveKind kind, size_t count, int world, const Codec& codec);

}  // namespace rdmaflow
