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
//   {"kind": "link", "seconds": 2, "streams": 4}
//     two ranks: the link rate from rank 0 to rank 1 (bench/link_rate.h).
// Every result also names the host of each rank ("hosts").
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace rdmaflow::e2e {

// Runs this process's rank of the job in RDMAFLOW_E2E_JOB; returns the exit code.
int worker_main();

// Median of the values after the first `skip` (the warm-up).
double median_after(const std::vector<double>& v, size_t skip);

// Payload bytes a job moves from one rank to another per step.
struct PairTraffic {
  int src = 0;
  int dst = 0;
  uint64_t bytes = 0;
};
// The pairs of a job on `ranks` ranks, from its plan (train) or its definition
// (transfer); none for the other kinds.
Result<std::vector<PairTraffic>> job_traffic(const nlohmann::json& job, int ranks);

// The most bytes one host's link carries per step in one direction, with the
// ranks on `hosts` (by rank): what crosses between hosts, out of or into each.
uint64_t busiest_link_bytes(const std::vector<PairTraffic>& traffic,
                            const std::vector<std::string>& hosts);

// Weights rank 0 wrote (weights_out): name -> values.
Result<std::map<std::string, std::vector<float>>> read_weights(const std::string& path);

}  // namespace rdmaflow::e2e
