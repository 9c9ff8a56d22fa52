// Where the ranks of a job that spans hosts meet when RDMAFLOW_RENDEZVOUS is
// unset: found through the launcher that started them, so `mpirun` and `srun`
// need no variable beyond what any MPI program is given.
//
//   1. PMIx (Open MPI's mpirun, srun --mpi=pmix, prterun): rank 0 starts the
//      store on a free port of its host's address (below) and publishes
//      "host:port" in the launcher's key-value store; every rank reads it after
//      a PMIx fence. Needs a build with PMIx (RDMAFLOW_WITH_PMIX).
//   2. Slurm (srun without PMIx): rank 0's host is the first node of
//      SLURM_STEP_NODELIST (where Slurm's block, cyclic and plane
//      distributions put task 0), its address what that name resolves to; the
//      port is the first of SLURM_STEP_RESV_PORTS (Slurm reserves them for the
//      step when MpiParams=ports= is configured), else
//      20000 + (SLURM_JOB_ID * 16 + SLURM_STEP_ID) mod 12000.
//
// Rank 0's host address (PMIx): the interface or address in
// RDMAFLOW_SOCKET_IFNAME, else the address of the interface of the default
// route (as Gloo and NCCL pick theirs when not told), else what the hostname
// resolves to when that is not loopback.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/rendezvous/rank_info.h"
#include "runtime/rendezvous/tcp_store.h"

namespace rdmaflow {

// Starts rank 0's store server listening at `bind` (port 0: any free port) and
// returns the address its clients connect to.
using StartStore = std::function<Result<HostPort>(const HostPort& bind)>;

struct LauncherRendezvous {
  HostPort address;    // where rank 0 serves the store
  std::string source;  // how it was found, for logs and errors
};

// Finds the rendezvous of this job through its launcher; rank 0 (info.rank) calls
// `start` once on the way. nullopt when no launcher above describes the job, with
// `why_not` saying what was looked for. Collective under PMIx: every rank calls it.
Result<std::optional<LauncherRendezvous>> find_launcher_rendezvous(const RankInfo& info,
                                                                   const EnvLookup& env,
                                                                   const StartStore& start,
                                                                   Millis timeout,
                                                                   std::string* why_not = nullptr);

// The first host of a Slurm hostlist: "h[0-3],x" -> "h0", "node[07-09]" -> "node07".
Result<std::string> first_slurm_host(const std::string& nodelist);

// This host's address that other hosts reach it at (rank 0's, above).
Result<std::string> host_address(const EnvLookup& env);

// The local address this host sends from to reach `host` (a name or address):
// the kernel's route lookup, no packet sent.
Result<std::string> local_address_toward(const std::string& host);

}  // namespace rdmaflow
