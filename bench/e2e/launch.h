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
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/malloc_tunables.h"
#include "common/status.h"
#include "transport/transport.h"

namespace rdmaflow::e2e {

using bench::kMallocTunables;

struct LaunchSpec {
  int ranks = 4;
  std::string transport;  // RDMAFLOW_TRANSPORT for the job
  // Set in every rank's environment (e.g. GLIBC_TUNABLES).
  std::vector<std::pair<std::string, std::string>> env;
  nlohmann::json job;
  std::chrono::milliseconds timeout{300000};
};

// Runs the job and returns rank 0's result. A rank that fails, dies or
// outlives the timeout fails the launch (the others are killed).
Result<nlohmann::json> launch(const LaunchSpec& spec);

// What RDMAFLOW_TRANSPORT=auto picks between two processes of this host (every
// job launch() starts is local), with its reason, and what each backend would
// move a pair's data over here: the per-peer rule of
// runtime/selection/transport_select.h applied to this process's own capabilities.
struct HostView {
  std::string auto_transport = "tcp";
  std::string auto_reason;
  std::map<std::string, Medium> medium;  // by backend; gRPC is a socket

  // "shared memory (same host)", "socket", ...; `transport` may be "auto".
  std::string medium_text(const std::string& transport) const;
};
HostView host_view();

// In a worker (`--e2e-worker`): the job and where to write the result.
Result<nlohmann::json> worker_job();
Status write_result(const nlohmann::json& result);

}  // namespace rdmaflow::e2e
