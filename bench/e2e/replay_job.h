// The worker side of rdmaflow-replay (bench/e2e/replay.cc): one rank replays
// a model's planned transfers step after step through a Session.
//
//   {"kind": "replay", "model": "/path/model.onnx", "dims": {"batch": 8},
//    "train": true, "steps": 10, "depth": 2, "vary": true, "gflops": 0}
//
// Every rank loads the model, cuts it into world-size pipeline stages
// (graph/pipeline.h), adds the backward pass when "train", and plans; the plan
// hash check at setup makes sure all ranks planned the same. Each step a rank
// runs its schedule: a Send fills the planned output buffer with a pattern of
// (transfer, step, offset) and sends it, a Recv checks every byte of what
// arrived against the same pattern, and a compute op sleeps for its estimated
// FLOPs at "gflops" (0: no stand-in). Dynamic tensors get a size from the
// size hint; with "vary" it alternates between half, the hint and 1.5x (above
// the hint: the read path). Rank 0 reports each rank's median step time, the
// slowest of them as the step time, bytes per step and bytes verified.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/rendezvous/bootstrap.h"

namespace rdmaflow::e2e {

Result<nlohmann::json> run_replay(const nlohmann::json& job, Bootstrap& boot);

}  // namespace rdmaflow::e2e
