// The worker side of the end-to-end demo and benchmark: one rank of a job
// described in JSON (bench/e2e/launch.h).
//
//   {"kind": "train", "mode": "ps", "widths": [784, 2048, 2048, 10], "batch": 48,
//    "steps": 30, "servers": 1, "lr": 0.1, "seed": 1, "depth": 2,
//    "progress": "auto", "weights_out": "/tmp/..."}
//     trains the MLP (examples/trainer/trainer.h); rank 0 reports the loss
//     curve, its step times, the bytes every rank sent and where each rank's
//     step time went.
//   {"kind": "transfer", "bytes": 16777216, "steps": 30, "depth": 2}
//     two ranks: one tensor of `bytes` from rank 0 to rank 1 and a 64-byte
//     acknowledgement back, per step; rank 0 reports the step times.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace rdmaflow::e2e {

// Runs this process's rank of the job in RDMAFLOW_E2E_JOB; returns the exit code.
int worker_main();

// Median of the values after the first `skip` (the warm-up).
double median_after(const std::vector<double>& v, size_t skip);

// Weights rank 0 wrote (weights_out): name -> values.
Result<std::map<std::string, std::vector<float>>> read_weights(const std::string& path);

}  // namespace rdmaflow::e2e
