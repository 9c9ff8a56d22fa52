// Rank detection: who am I, how many are we, and who told us.
//
// Sources, first match wins (each documented in docs/configuration.md):
//   1. RDMAFLOW_RANK / RDMAFLOW_WORLD_SIZE (+ RDMAFLOW_LOCAL_RANK / RDMAFLOW_LOCAL_SIZE)
//   2. Open MPI:  OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (+ _LOCAL_RANK / _LOCAL_SIZE)
//   3. PMI:       PMI_RANK / PMI_SIZE (+ MPI_LOCALRANKID / MPI_LOCALNRANKS, as Hydra sets them)
//   4. Slurm:     SLURM_PROCID / SLURM_NTASKS (+ SLURM_LOCALID, SLURM_STEP_NUM_NODES)
//   5. nothing:   a single process (rank 0, world 1)
// A source counts as soon as one of its rank/size variables is set; then both must be
// well-formed and consistent, or detection fails with an error naming the variable
// (we never fall through to a weaker source on a half-set one: that would silently
// run a job as N independent single processes).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

namespace rdmaflow {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this host
  int local_size = 0;  // processes on this host; 0 when the source does not say
  // Whether every rank runs on this host; empty when the source does not say.
  std::optional<bool> single_host;
  // Which variables were used: "RDMAFLOW_RANK/RDMAFLOW_WORLD_SIZE",
  // "Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)", ..., or "default (single process)".
  std::string source;

  std::string to_string() const;  // "rank 2 of 4 (local 2 of 4) from Open MPI (...)"
};

// Looks a variable up; returns nullopt when unset or empty.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// Reads the process environment.
EnvLookup process_env();

// Detects rank and world size from `env` (the process environment by default) and
// logs the source at info level.
Result<RankInfo> detect_rank_info(const EnvLookup& env = process_env());

}  // namespace rdmaflow
