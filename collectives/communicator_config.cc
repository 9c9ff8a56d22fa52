// A communicator's FabricConfig from its CommunicatorOptions and the
// RDMAFLOW_COLL_* environment, read once when it is created.
#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "collectives/communicator_internal.h"
#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {

namespace {

// RDMAFLOW_COLL_POLL_US's default: 30 us. On 2 ranks over loopback on a
// quiet machine a wait that sleeps at once paid the core's wake-up twice per
// call (8 B 80 us against 10 with the poll, 64 KiB 102 against 29), at a cost
// of about 10% at 256 KiB; under load it was no worse, and a poller that loses
// its core stops for 50 ms (docs/benchmarks.md "Polling 30 us by default").
constexpr int64_t kPollUs = 30;

// More spinning threads than cores on this host: the ranks of this host (from
// the launcher, else the whole world) against the host's online CPUs.
// Open MPI says so itself when it places more ranks than slots
// (mpi_oversubscribe); where ranks share cores the launcher cannot see (hosts
// that are containers or namespaces of one machine, as scripts/cluster makes)
// the user says so the way Open MPI's documentation asks, with
// mpi_yield_when_idle, and rdmaflow's ranks yield as Open MPI's do.
bool oversubscribed(int world) {
  for (const auto& v :
       {env_string("OMPI_MCA_mpi_oversubscribe"), env_string("OMPI_MCA_mpi_yield_when_idle")}) {
    if (v && (*v == "1" || *v == "true")) return true;
  }
  int64_t local = world;
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    auto v = env_int(name, 0);
    if (v.is_ok() && *v > 0) {
      local = *v;
      break;
    }
  }
  // The host's CPUs, not this process's affinity: launchers bind each rank to
  // a core when there are enough of them.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return local > cpus;
}

// The launcher's index of this rank on its host, else -1.
int64_t launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    auto v = env_int(name, -1);
    if (v.is_ok() && *v >= 0) return *v;
  }
  return -1;
}

// RDMAFLOW_COLL_BIND=1: every thread of the process (and those started later)
// is bound to one CPU, the launcher's local rank-th of the host's, as `mpirun
// --bind-to core` binds a rank. Unbound ranks on loopback sleep on their
// sockets, and a socket's wake-up is a synchronous one: the scheduler moves
// the woken rank onto its waker's CPU, so both ranks of a pair end up sharing
// one core while the other runs something else (Open MPI's ranks never sleep
// and stay apart). docs/benchmarks.md, "Loopback 1 MiB: what Open MPI does
// that we did not". Only a process nobody bound (it may run on every online
// CPU), with a local rank from the launcher, on a host with no more ranks
// than CPUs; otherwise it logs why and binds nothing.
void bind_local_cpu(bool crowded) {
  const int64_t local = launcher_local_rank();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const char* why = nullptr;
  if (local < 0) {
    why = "no local rank from the launcher";
  } else if (crowded) {
    why = "more ranks than CPUs on this host";
  } else if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    why = "sched_getaffinity failed";
  } else if (CPU_COUNT(&allowed) < online) {
    why = "the launcher bound this rank already";
  }
  if (why != nullptr) {
    RDMAFLOW_LOG_INFO("collectives: RDMAFLOW_COLL_BIND=1 binds nothing: {}", why);
    return;
  }
  int want = static_cast<int>(local % CPU_COUNT(&allowed));
  int cpu = 0;
  for (; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && want-- == 0) break;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  int failed = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) {
      const int tid = std::atoi(e->d_name);
      if (tid > 0 && sched_setaffinity(tid, sizeof(one), &one) != 0) ++failed;
    }
    closedir(dir);
  }
  if (sched_setaffinity(0, sizeof(one), &one) != 0) ++failed;
  if (failed > 0) {
    RDMAFLOW_LOG_WARN("RDMAFLOW_COLL_BIND=1: {} thread(s) could not be bound to cpu {}", failed,
                      cpu);
  } else {
    RDMAFLOW_LOG_INFO("collectives: local rank {} bound to cpu {} (RDMAFLOW_COLL_BIND=1)", local,
                      cpu);
  }
}

}  // namespace

Result<int64_t> knob(const char* name, int64_t given, int64_t fallback, int64_t min) {
  if (given > 0) return given;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t v, env_int(name, fallback));
  if (v < min) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "create communicator", -1,
                          std::string(name) + " must be at least " + std::to_string(min));
  }
  return v;
}

Result<FabricKnobs> fabric_config_from_env(const CommunicatorOptions& options, int world) {
  const char* op = "create communicator";
  FabricConfig cfg;
  RDMAFLOW_ASSIGN_OR_RETURN(
      int64_t slot_bytes,
      knob("RDMAFLOW_COLL_SLOT_BYTES", static_cast<int64_t>(options.slot_bytes), 512 * 1024, 64));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t slots, knob("RDMAFLOW_COLL_SLOTS", options.slots, 4, 1));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t lanes, knob("RDMAFLOW_COLL_LANES", options.lanes, 2, 1));
  // A rank with a core of its own spins (driving progress) for up to 10 ms
  // before it sleeps. On an oversubscribed host it polls every peer's socket
  // without blocking and yields the core between polls, as Open MPI's ranks
  // do, for 1 ms: a rank asleep in ppoll costs every frame a wake-up, and
  // once woken it waits its turn behind the ranks that hold the cores; a
  // poller takes the frame at its next turn (4 hosts x 1 on 2 cores: 8 B
  // 1.3-1.7x faster than sleeping at once, docs/benchmarks.md, "Crowded
  // ranks poll and yield").
  const bool crowded = oversubscribed(world);
  int64_t spin = options.spin_us;
  const bool spin_given = spin >= 0 || env_string("RDMAFLOW_COLL_SPIN_US").has_value();
  if (spin < 0) {
    RDMAFLOW_ASSIGN_OR_RETURN(spin, env_int("RDMAFLOW_COLL_SPIN_US", crowded ? 1000 : 10000));
  }
  // Waits on direct peers are plain loads (plus sched_yield when crowded), no
  // system call: there a crowded rank polls only briefly before it sleeps on
  // the doorbell (4 ranks on one host's 2 cores: 50 us beat 1 ms at 64 KiB).
  const int64_t direct_spin = spin_given ? spin : (crowded ? 50 : 10000);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t yield, env_int("RDMAFLOW_COLL_YIELD", -1));
  // Of the spin, how long a rank with a core of its own polls its sockets
  // without blocking after progress, as Open MPI's ranks do, before it may
  // sleep in ppoll (Run::poll_common_driver in executor_wait.cc).
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t poll, env_int("RDMAFLOW_COLL_POLL_US", kPollUs));
  if (poll < 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "RDMAFLOW_COLL_POLL_US must be >= 0");
  }
  // Same-host peers whose channel maps their memory: memcpy + sequence words.
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t direct, env_int("RDMAFLOW_COLL_DIRECT", 1));
  if (direct != 0 && direct != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "RDMAFLOW_COLL_DIRECT must be 0 or 1");
  }
  cfg.direct = options.direct.value_or(direct == 1);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t mixed, env_int("RDMAFLOW_COLL_MIXED_WAIT", 0));
  if (mixed != 0 && mixed != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "RDMAFLOW_COLL_MIXED_WAIT must be 0 or 1");
  }
  cfg.mixed_wait = mixed == 1;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t mixed_poll, env_int("RDMAFLOW_COLL_MIXED_POLL", 1));
  if (mixed_poll != 0 && mixed_poll != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "RDMAFLOW_COLL_MIXED_POLL must be 0 or 1");
  }
  cfg.mixed_poll = mixed_poll == 1;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t stage, env_int("RDMAFLOW_COLL_STAGE", 0));
  if (stage != 0 && stage != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "RDMAFLOW_COLL_STAGE must be 0 or 1");
  }
  cfg.stage_all = stage == 1;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t land_min,
                            env_int("RDMAFLOW_COLL_LAND_MIN", static_cast<int64_t>(cfg.land_min)));
  if (land_min < 0 || land_min > (int64_t{1} << 40)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "RDMAFLOW_COLL_LAND_MIN must be 0 (never) or a size in bytes up to 2^40");
  }
  cfg.land_min = static_cast<size_t>(land_min);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t bind, env_int("RDMAFLOW_COLL_BIND", 0));
  if (bind != 0 && bind != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "RDMAFLOW_COLL_BIND must be 0 or 1");
  }
  if (bind == 1) bind_local_cpu(crowded);
  if (yield < 0) yield = crowded ? 1 : 0;
  cfg.slot_bytes = static_cast<size_t>(slot_bytes);
  cfg.slots = static_cast<int>(slots);
  cfg.lanes = static_cast<int>(std::min<int64_t>(lanes, options.p2p ? 62 : 63));
  const int collective_lanes = cfg.lanes;
  if (options.p2p) ++cfg.lanes;  // the last lane is send()/recv()'s
  cfg.spin = std::chrono::microseconds(std::max<int64_t>(0, spin));
  cfg.direct_spin = std::chrono::microseconds(std::max<int64_t>(0, direct_spin));
  cfg.poll = std::chrono::microseconds(std::min<int64_t>(poll, 60'000'000));
  cfg.yield_polls = static_cast<int>(std::min<int64_t>(yield, 1 << 20));
  // Held credits (FabricConfig::credit_hold) pay where ranks share cores: a
  // sendmsg and a wake-up fewer per piece. A rank with a core of its own
  // measured slower with them (2 ranks on loopback, quiet, 8 B: 104-107 us
  // held against 17-60 us sent at once), so there every credit goes at once
  // unless RDMAFLOW_COLL_CREDIT_HOLD says otherwise.
  if (!crowded && !env_string("RDMAFLOW_COLL_CREDIT_HOLD").has_value()) cfg.credit_hold = 0;
  cfg.timeout = options.timeout.value_or(default_timeout());
  return FabricKnobs{cfg, crowded, collective_lanes};
}

}  // namespace rdmaflow
