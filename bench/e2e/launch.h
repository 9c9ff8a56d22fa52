// Launching a job for the end-to-end demo and benchmark, on this host or on
// the hosts of a cluster.
//
// On this host the launcher re-executes its own binary N times with
// `--e2e-worker` and the environment of a real job (RDMAFLOW_RANK,
// RDMAFLOW_WORLD_SIZE, RDMAFLOW_LOCAL_SIZE, RDMAFLOW_RENDEZVOUS on a free
// loopback port, RDMAFLOW_TRANSPORT), the job itself as JSON in
// RDMAFLOW_E2E_JOB, and a file in RDMAFLOW_E2E_OUT where rank 0 writes its
// JSON result. The ranks bootstrap exactly as under mpirun; nothing is shared
// but the rendezvous address.
//
// On hosts (a HostLayout: `--hosts h0:2,h1:2`) it runs the same workers under
// `mpirun -H ... -np N`, optionally through an rsh agent (the simulated
// cluster's, docs/cluster.md): rank, world and rendezvous come from the
// launcher as for any MPI program, and the result file lies beside the
// executable, which every host runs from a shared file system.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/link_rate.h"
#include "bench/malloc_tunables.h"
#include "common/status.h"
#include "transport/transport.h"

namespace rdmaflow::e2e {

using bench::kMallocTunables;

// The hosts a job runs on, and how mpirun reaches them.
struct HostLayout {
  std::vector<std::pair<std::string, int>> hosts;  // name, slots
  std::string rsh_agent;                           // --mca plm_rsh_agent; empty: mpirun's own (ssh)
  std::vector<std::string> mpirun_args;            // more arguments for mpirun

  // "h0:2,h1:2" (a host without ":N" has one slot).
  static Result<HostLayout> parse(const std::string& text);
  int slots() const;
  // Slots per host for `ranks` ranks: every slot when they fill them all,
  // else one per host in turn, so that two ranks land on two hosts.
  std::vector<std::pair<std::string, int>> take(int ranks) const;
  // The host of each rank, as mpirun places them by slot on take(ranks).
  std::vector<std::string> place(int ranks) const;
};

struct LaunchSpec {
  int ranks = 4;
  const HostLayout* hosts = nullptr;  // null: forked on this host
  std::string transport;              // RDMAFLOW_TRANSPORT for the job
  // Set in every rank's environment (e.g. GLIBC_TUNABLES).
  std::vector<std::pair<std::string, std::string>> env;
  nlohmann::json job;
  std::chrono::milliseconds timeout{300000};
};

// Runs the job and returns rank 0's result. A rank that fails, dies or
// outlives the timeout fails the launch (the others are killed).
Result<nlohmann::json> launch(const LaunchSpec& spec);

// The link rate between the first two hosts of `hosts` (a "link" job, rank 0
// sending; bench/link_rate.h).
Result<bench::LinkRate> measure_link(const HostLayout& hosts, double seconds);

// A path every rank's host sees, for files the job writes and the launcher
// reads: in /tmp on this host; across hosts beside the executable (the hosts
// run it from a shared file system; each simulated host has a /tmp of its own).
Result<std::string> shared_path(const HostLayout* hosts, const std::string& name);

// What RDMAFLOW_TRANSPORT=auto picks between two processes of this host (every
// job launch() starts is local), with its reason, and what each backend would
// move a pair's data over here: the per-peer rule of
// runtime/selection/transport_select.h applied to this process's own capabilities.
// The same rule for two ranks on different hosts (assumed alike), in
// `*_across`.
struct HostView {
  std::string auto_transport = "tcp";
  std::string auto_reason;
  std::map<std::string, Medium> medium;  // by backend; gRPC is a socket
  std::string auto_across = "tcp";
  std::string auto_across_reason;
  std::map<std::string, std::string> medium_across;  // by backend, in words

  // "shared memory (same host)", "socket", ...; `transport` may be "auto".
  std::string medium_text(const std::string& transport) const;
  // The media of a job whose ranks run on `hosts` (by rank): the same-host
  // medium where a host has two ranks, and the one across hosts where there
  // are several: "shared memory (same host) + socket".
  std::string medium_text(const std::string& transport,
                          const std::vector<std::string>& hosts) const;
};
// `hosts`: where the across-hosts pair is taken to run, for the reasons (its
// first two hosts); null on one host.
HostView host_view(const HostLayout* hosts = nullptr);

// In a worker (`--e2e-worker`): the job and where to write the result.
Result<nlohmann::json> worker_job();
Status write_result(const nlohmann::json& result);

}  // namespace rdmaflow::e2e
