#include "runtime/rendezvous/rank_info.h"

#include <charconv>
#include <cstdlib>
#include <limits>

#include "common/log.h"

namespace rdmaflow {

namespace {

constexpr const char* kOp = "detect rank";

// The variables one launcher sets. Null entries are not provided by that launcher.
struct LauncherVars {
  const char* label;
  const char* rank;
  const char* size;
  const char* size_fallback;  // older name of `size`
  const char* local_rank;
  const char* local_size;
  const char* num_nodes;           // exact node count of this job step
  const char* num_nodes_fallback;  // allocation node count (only "1" is conclusive)
};

constexpr LauncherVars kLaunchers[] = {
    {"RDMAFLOW", "RDMAFLOW_RANK", "RDMAFLOW_WORLD_SIZE", nullptr, "RDMAFLOW_LOCAL_RANK",
     "RDMAFLOW_LOCAL_SIZE", nullptr, nullptr},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr,
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, nullptr},
    {"PMI", "PMI_RANK", "PMI_SIZE", nullptr, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr,
     nullptr},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", nullptr,
     "SLURM_STEP_NUM_NODES", "SLURM_NNODES"},
};

// Reads an integer variable in [min_value, INT_MAX]; nullopt when unset.
Result<std::optional<int>> read_int(const EnvLookup& env, const char* name, int min_value) {
  if (name == nullptr) return std::optional<int>();
  auto text = env(name);
  if (!text) return std::optional<int>();
  int64_t v = 0;
  const char* begin = text->data();
  const char* end = begin + text->size();
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (ec != std::errc() || ptr != end) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1,
                          std::string(name) + "='" + *text + "' is not an integer");
  }
  if (v < min_value || v > std::numeric_limits<int>::max()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1,
                          std::string(name) + "=" + *text +
                              " is out of range (must be >= " + std::to_string(min_value) + ")");
  }
  return std::optional<int>(static_cast<int>(v));
}

Status inconsistent(const std::string& what) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1, what);
}

// Detection from one launcher's variables, or nullopt when it set none of them.
Result<std::optional<RankInfo>> from_launcher(const EnvLookup& env, const LauncherVars& l) {
  const char* size_name = l.size;
  if (!env(l.size) && l.size_fallback != nullptr && env(l.size_fallback)) {
    size_name = l.size_fallback;
  }
  const bool has_rank = env(l.rank).has_value();
  const bool has_size = env(size_name).has_value();
  if (!has_rank && !has_size) return std::optional<RankInfo>();
  if (!has_rank || !has_size) {
    const char* missing = has_rank ? size_name : l.rank;
    const char* present = has_rank ? l.rank : size_name;
    return inconsistent(std::string(present) + " is set but " + missing +
                        " is not; set both or neither");
  }

  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> rank, read_int(env, l.rank, 0));
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> world, read_int(env, size_name, 1));
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> local_rank, read_int(env, l.local_rank, 0));
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> local_size, read_int(env, l.local_size, 1));
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> nodes, read_int(env, l.num_nodes, 1));
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<int> alloc_nodes, read_int(env, l.num_nodes_fallback, 1));

  if (*rank >= *world) {
    return inconsistent(std::string(l.rank) + "=" + std::to_string(*rank) + " is not below " +
                        size_name + "=" + std::to_string(*world));
  }
  if (local_size && *local_size > *world) {
    return inconsistent(std::string(l.local_size) + "=" + std::to_string(*local_size) +
                        " exceeds " + size_name + "=" + std::to_string(*world));
  }
  if (local_rank && local_size && *local_rank >= *local_size) {
    return inconsistent(std::string(l.local_rank) + "=" + std::to_string(*local_rank) +
                        " is not below " + l.local_size + "=" + std::to_string(*local_size));
  }
  if (local_rank && *local_rank > *rank) {
    return inconsistent(std::string(l.local_rank) + "=" + std::to_string(*local_rank) +
                        " exceeds " + l.rank + "=" + std::to_string(*rank));
  }
  if (nodes && *nodes > *world) {
    return inconsistent(std::string(l.num_nodes) + "=" + std::to_string(*nodes) + " exceeds " +
                        size_name + "=" + std::to_string(*world));
  }

  RankInfo info;
  info.rank = *rank;
  info.world_size = *world;
  if (local_size) {
    info.local_size = *local_size;
    info.single_host = (*local_size == *world);
  } else if (nodes) {
    info.single_host = (*nodes == 1);
  } else if (alloc_nodes && *alloc_nodes == 1) {
    info.single_host = true;
  } else if (*world == 1) {
    info.single_host = true;
  }
  if (info.local_size == 0 && info.single_host == true) info.local_size = *world;
  // Without a local rank from the launcher, assume the host-local numbering equals the
  // global one (exact on one host; documented for the multi-host case).
  info.local_rank = local_rank ? *local_rank : *rank;
  if (info.local_size > 0 && info.local_rank >= info.local_size) {
    return inconsistent(std::string(l.rank) + "=" + std::to_string(*rank) +
                        " cannot be a local rank on a host with " +
                        std::to_string(info.local_size) + " processes; set " +
                        (l.local_rank ? l.local_rank : "the local rank"));
  }
  info.source = std::string(l.label) + " (" + l.rank + "/" + size_name + ")";
  return std::optional<RankInfo>(std::move(info));
}

}  // namespace

std::string RankInfo::to_string() const {
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                  " (local rank " + std::to_string(local_rank);
  if (local_size > 0) s += " of " + std::to_string(local_size);
  s += ", ";
  if (!single_host) {
    s += "host layout unknown";
  } else {
    s += *single_host ? "single host" : "several hosts";
  }
  return s + ") from " + source;
}

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

Result<RankInfo> detect_rank_info(const EnvLookup& env) {
  for (const auto& launcher : kLaunchers) {
    RDMAFLOW_ASSIGN_OR_RETURN(std::optional<RankInfo> info, from_launcher(env, launcher));
    if (info) {
      RDMAFLOW_LOG_INFO("bootstrap: {}", info->to_string());
      return *std::move(info);
    }
  }
  RankInfo single;
  single.local_size = 1;
  single.single_host = true;
  single.source = "default (single process: no RDMAFLOW_RANK, Open MPI, PMI or Slurm variables)";
  RDMAFLOW_LOG_INFO("bootstrap: {}", single.to_string());
  return single;
}

}  // namespace rdmaflow
