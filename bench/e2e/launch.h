// Launching a job of N local processes for the end-to-end demo and benchmark.
//
// The launcher re-executes its own binary N times with `--e2e-worker` and the
// environment of a real job (RDMAFLOW_RANK, RDMAFLOW_WORLD_SIZE,
// RDMAFLOW_LOCAL_SIZE, RDMAFLOW_RENDEZVOUS on a free loopback port,
// RDMAFLOW_TRANSPORT), the job itself as JSON in RDMAFLOW_E2E_JOB, and a file
// in RDMAFLOW_E2E_OUT where rank 0 writes its JSON result. The ranks bootstrap
// exactly as under mpirun; nothing is shared but the rendezvous address.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace rdmaflow::e2e {

struct LaunchSpec {
  int ranks = 4;
  std::string transport;  // RDMAFLOW_TRANSPORT for the job
  nlohmann::json job;
  std::chrono::milliseconds timeout{300000};
};

// Runs the job and returns rank 0's result. A rank that fails, dies or
// outlives the timeout fails the launch (the others are killed).
Result<nlohmann::json> launch(const LaunchSpec& spec);

// In a worker (`--e2e-worker`): the job and where to write the result.
Result<nlohmann::json> worker_job();
Status write_result(const nlohmann::json& result);

}  // namespace rdmaflow::e2e
