#include "runtime/selection/transport_select.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/env.h"
#include "common/log.h"
#include "common/strings.h"
#include "runtime/session/session_layout.h"

namespace rdmaflow {

namespace {

constexpr const char* kOp = "select transports";
constexpr uint32_t kRecordVersion = 1;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

uint64_t namespace_inode(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Why `name` cannot be used on a rank whose record is `r`, in a few words.
std::string why_unusable(const RankCapabilities& r, int rank, const std::string& name) {
  for (const auto& b : r.backends) {
    if (b.name != name) continue;
    if (b.viable) return {};
    if (!r.requested.empty() && r.requested != "auto" && r.requested != name) {
      return name + " not allowed on " + rank_text(rank) + " (RDMAFLOW_TRANSPORT=" + r.requested +
             ")";
    }
    return name + " not viable on " + rank_text(rank);
  }
  return name + " not built on " + rank_text(rank);
}

// Why the pair cannot use `name`, or empty when neither rank rules it out.
std::string pair_unusable(int ra, const RankCapabilities& a, int rb, const RankCapabilities& b,
                          const std::string& name) {
  std::string wa = why_unusable(a, ra, name), wb = why_unusable(b, rb, name);
  if (!wa.empty() && !wb.empty()) {
    const std::string sa = wa.substr(0, wa.find(" on rank "));
    const std::string sb = wb.substr(0, wb.find(" on rank "));
    if (sa == sb) return sa + " on either rank";
    return wa + ", " + wb;
  }
  return wa.empty() ? wb : wa;
}

}  // namespace

std::string requested_transport(const std::string& option) {
  if (!option.empty()) return option;
  return env_string("RDMAFLOW_TRANSPORT").value_or("auto");
}

// ---------------------------------------------------------------- records

const BackendReport* RankCapabilities::usable(const std::string& name) const {
  for (const auto& b : backends) {
    if (b.name == name && b.viable) return &b;
  }
  return nullptr;
}

Bytes RankCapabilities::encode() const {
  ByteWriter w;
  w.u32(kRecordVersion).str(requested).str(hostname).str(host_id);
  w.u32(static_cast<uint32_t>(backends.size()));
  for (const auto& b : backends) {
    w.str(b.name).u8(b.viable ? 1 : 0).str(b.why_not);
    w.u32(static_cast<uint32_t>(b.caps.components.size()));
    for (const auto& c : b.caps.components) w.str(c);
    w.str(b.caps.device).str(b.caps.fabric);
  }
  return std::move(w.out());
}

Result<RankCapabilities> RankCapabilities::decode(std::span<const uint8_t> bytes) {
  auto bad = [](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kProtocolError, kOp, -1, "malformed capability record: " + why);
  };
  ByteReader r(bytes);
  RankCapabilities rec;
  uint32_t version = 0, n = 0;
  if (!r.u32(version)) return bad("truncated");
  if (version != kRecordVersion) {
    return bad("version " + std::to_string(version) + ", this build speaks " +
               std::to_string(kRecordVersion));
  }
  if (!r.str(rec.requested) || !r.str(rec.hostname) || !r.str(rec.host_id) || !r.u32(n)) {
    return bad("truncated header");
  }
  if (n > 64) return bad(std::to_string(n) + " backends");
  for (uint32_t i = 0; i < n; ++i) {
    BackendReport b;
    uint8_t viable = 0;
    uint32_t m = 0;
    if (!r.str(b.name) || !r.u8(viable) || !r.str(b.why_not) || !r.u32(m) || m > 256) {
      return bad("backend " + std::to_string(i));
    }
    b.viable = viable == 1;
    for (uint32_t j = 0; j < m; ++j) {
      std::string c;
      if (!r.str(c)) return bad("backend " + std::to_string(i) + " components");
      b.caps.components.push_back(std::move(c));
    }
    if (!r.str(b.caps.device) || !r.str(b.caps.fabric)) {
      return bad("backend " + std::to_string(i) + " device");
    }
    rec.backends.push_back(std::move(b));
  }
  return rec;
}

RankCapabilities local_host_identity() {
  RankCapabilities r;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) r.hostname = host;
  if (r.hostname.empty()) r.hostname = "unknown";
  const std::string boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  const uint64_t pid_ns = namespace_inode("/proc/self/ns/pid");
  const uint64_t ipc_ns = namespace_inode("/proc/self/ns/ipc");
  if (!boot_id.empty() && pid_ns != 0 && ipc_ns != 0) {
    r.host_id = boot_id + "/pid:" + std::to_string(pid_ns) + "/ipc:" + std::to_string(ipc_ns);
  }
  return r;
}

// ---------------------------------------------------------------- decision

std::string PeerTransport::describe() const {
  return "transport to " + rank_text(peer) + ": " + transport + " (" + reason + ")";
}

Result<PeerTransport> decide_pair(int rank_a, const RankCapabilities& a, int rank_b,
                                  const RankCapabilities& b) {
  // Decide in rank order so both ends build the very same answer and reason.
  if (rank_b < rank_a) {
    auto r = decide_pair(rank_b, b, rank_a, a);
    if (r) r->peer = rank_b;
    return r;
  }
  PeerTransport out;
  out.peer = rank_b;
  const int ra = rank_a, rb = rank_b;

  const bool same_host = !a.host_id.empty() && a.host_id == b.host_id;
  // Both ranks named one backend: that is what the user asked for.
  if (a.requested == b.requested && a.requested != "auto" && a.usable(a.requested) &&
      b.usable(b.requested)) {
    out.transport = a.requested;
    out.reason = "RDMAFLOW_TRANSPORT=" + a.requested + " on both ranks";
    out.medium =
        transport_reach(a.requested, Endpoint{ra, a.hostname, &a.usable(a.requested)->caps},
                        Endpoint{rb, b.hostname, &b.usable(b.requested)->caps}, same_host)
            .medium;
    return out;
  }

  // Every backend both ranks may use answers for the pair: the best medium
  // wins (same-host memory, then RDMA, then sockets; as NCCL takes P2P/SHM over
  // NET within a node), and among equals the higher priority (`a.backends` is
  // in priority order). A backend that does not reach says why; those reasons
  // explain a socket choice and the error when nothing is left.
  std::vector<std::string> why_not;
  std::vector<std::string> both_allow;  // usable on both ranks but reaching nothing
  std::string best;
  Reach best_reach;
  for (const auto& backend : a.backends) {
    const BackendReport* ua = a.usable(backend.name);
    const BackendReport* ub = b.usable(backend.name);
    if (!ua || !ub) {
      why_not.push_back(pair_unusable(ra, a, rb, b, backend.name));
      continue;
    }
    const Reach r = transport_reach(backend.name, Endpoint{ra, a.hostname, &ua->caps},
                                    Endpoint{rb, b.hostname, &ub->caps}, same_host);
    if (r.medium == Medium::kNone) {
      why_not.push_back(r.reason);
      both_allow.push_back(backend.name);
    } else if (best.empty() || r.medium > best_reach.medium) {
      best = backend.name;
      best_reach = r;
    }
  }
  if (!best.empty()) {
    out.transport = best;
    out.medium = best_reach.medium;
    out.reason = best_reach.reason.empty() ? join(why_not, "; ") : best_reach.reason;
    return out;
  }
  // Whatever both allow, best first (e.g. RDMAFLOW_TRANSPORT=ucx across hosts).
  if (!both_allow.empty()) {
    out.transport = both_allow.front();
    out.reason = "the only backend both ranks allow (" + join(why_not, "; ") + ")";
    return out;
  }
  std::string detail;
  for (const auto& [r, rec] : {std::pair<int, const RankCapabilities*>{ra, &a}, {rb, &b}}) {
    std::vector<std::string> usable;
    for (const auto& backend : rec->backends) {
      if (backend.viable) usable.push_back(backend.name);
    }
    detail += (detail.empty() ? "" : "; ") + rank_text(r) +
              " (RDMAFLOW_TRANSPORT=" + rec->requested + ") offers " +
              (usable.empty() ? "nothing" : join(usable));
    for (const auto& backend : rec->backends) {
      if (!backend.viable && backend.name == rec->requested) {
        detail += " (" + backend.name + ": " + backend.why_not + ")";
      }
    }
  }
  return RDMAFLOW_ERROR(
      Code::kNotViable, kOp, rank_b,
      rank_text(ra) + " and " + rank_text(rb) + " have no transport in common: " + detail);
}

// ---------------------------------------------------------------- selection

TransportSelection::~TransportSelection() {
  shutdown();
}

void TransportSelection::shutdown() {
  for (auto& t : owned_) {
    if (t) t->shutdown();
  }
}

Transport* TransportSelection::transport_for(int peer) const {
  if (peer < 0 || peer >= world_size() || peers_[static_cast<size_t>(peer)].transport.empty()) {
    return nullptr;
  }
  const std::string& name = peers_[static_cast<size_t>(peer)].transport;
  for (const auto& t : owned_) {
    if (t->name() == name) return t.get();
  }
  return nullptr;
}

std::vector<Transport*> TransportSelection::per_peer() const {
  std::vector<Transport*> out;
  for (int p = 0; p < world_size(); ++p) out.push_back(transport_for(p));
  return out;
}

std::vector<Transport*> TransportSelection::in_use() const {
  std::vector<Transport*> out;
  for (const auto& t : owned_) out.push_back(t.get());
  return out;
}

TransportSelector TransportSelection::selector() const {
  return [this](int peer) { return transport_for(peer); };
}

std::string TransportSelection::name() const {
  if (owned_.empty()) return "local";
  std::string out;
  for (const auto& t : owned_) out += (out.empty() ? "" : "+") + t->name();
  return out;
}

std::string TransportSelection::summary() const {
  std::string out;
  for (const auto& p : peers_) {
    if (p.transport.empty()) continue;
    out +=
        (out.empty() ? "" : "; ") + rank_text(p.peer) + ": " + p.transport + " (" + p.reason + ")";
  }
  return out.empty() ? "no peers" : out;
}

LocalProbe probe_transports(const std::string& requested, const TransportConfig& config) {
  const auto names = transport_backend_names();
  const bool known =
      requested == "auto" || std::find(names.begin(), names.end(), requested) != names.end();
  LocalProbe out;
  RankCapabilities& mine = out.record;
  mine = local_host_identity();
  mine.requested = requested;
  if (!known) {
    out.error = RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1,
                               "RDMAFLOW_TRANSPORT=" + requested +
                                   " names no transport of this build (auto, " + join(names, ", ") +
                                   "; grpc only for Session)");
  }
  for (const auto& n : names) {
    BackendReport b;
    b.name = n;
    if (requested != "auto" && requested != n) {
      b.why_not = "not requested (RDMAFLOW_TRANSPORT=" + requested + ")";
      mine.backends.push_back(std::move(b));
      continue;
    }
    auto t = make_transport(n, config);
    if (t) {
      b.viable = true;
      b.caps = (*t)->capabilities();
      out.transports.push_back(std::move(*t));
    } else {
      b.why_not = t.status().reason();
      if (requested == n) {
        out.error = RDMAFLOW_ERROR(Code::kNotViable, kOp, -1,
                                   "RDMAFLOW_TRANSPORT=" + n + ", but " + n +
                                       " is not viable on this machine: " + t.status().reason());
      }
    }
    mine.backends.push_back(std::move(b));
  }
  return out;
}

Result<std::unique_ptr<TransportSelection>> select_transports(const std::string& requested,
                                                              const TransportConfig& config,
                                                              const AllGather& allgather) {
  const int me = config.rank;

  // 1. Create what RDMAFLOW_TRANSPORT allows and describe it.
  LocalProbe probe = probe_transports(requested, config);
  const RankCapabilities& mine = probe.record;
  std::vector<std::unique_ptr<Transport>>& created = probe.transports;
  const Status& local_error = probe.error;
  {
    std::string here;
    for (const auto& b : mine.backends) {
      if (b.viable) {
        here +=
            "; " + b.name + (b.caps.components.empty() ? "" : " (" + join(b.caps.components) + ")");
      } else if (requested == "auto" || requested == b.name) {
        here += "; " + b.name + " not viable: " + b.why_not;
      }
    }
    RDMAFLOW_LOG_INFO("transport selection on rank {} (RDMAFLOW_TRANSPORT={}, host '{}'){}", me,
                      requested, mine.hostname, here);
  }

  // 2. Learn everyone's record (also when this rank already failed: the others
  // must not wait for it, and they report its reason).
  auto gathered = allgather(mine.encode());
  auto drop = [&] {
    for (auto& t : created) t->shutdown();
  };
  if (!local_error.is_ok()) {
    drop();
    return local_error;
  }
  if (!gathered) {
    drop();
    return gathered.status().with_op(kOp);
  }
  const int world = static_cast<int>(gathered->size());
  std::vector<RankCapabilities> records;
  for (int r = 0; r < world; ++r) {
    auto rec = RankCapabilities::decode((*gathered)[static_cast<size_t>(r)]);
    if (!rec) {
      drop();
      return RDMAFLOW_ERROR(Code::kProtocolError, kOp, r, rec.status().reason());
    }
    records.push_back(std::move(*rec));
  }

  // 3. Decide every pair (not only this rank's): every rank reaches the same
  // verdict, so a pair without a common transport fails the whole job at once.
  std::unique_ptr<TransportSelection> sel(new TransportSelection());
  sel->rank_ = me;
  sel->requested_ = requested;
  sel->peers_.resize(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) {
    for (int j = i + 1; j < world; ++j) {
      auto d = decide_pair(i, records[static_cast<size_t>(i)], j, records[static_cast<size_t>(j)]);
      if (!d) {
        drop();
        return d.status();
      }
      if (i == me) sel->peers_[static_cast<size_t>(j)] = *d;
      if (j == me) {
        sel->peers_[static_cast<size_t>(i)] = *d;
        sel->peers_[static_cast<size_t>(i)].peer = i;
      }
    }
  }
  sel->peers_[static_cast<size_t>(me)].peer = me;
  sel->records_ = std::move(records);

  // 4. Keep the transports some peer uses.
  for (auto& t : created) {
    const bool used = std::any_of(sel->peers_.begin(), sel->peers_.end(),
                                  [&](const PeerTransport& p) { return p.transport == t->name(); });
    if (used) {
      sel->owned_.push_back(std::move(t));
    } else {
      t->shutdown();
    }
  }
  for (const auto& p : sel->peers_) {
    if (p.transport.empty()) continue;
    if (!sel->transport_for(p.peer)) {  // cannot happen: decided from this rank's own record
      return RDMAFLOW_ERROR(Code::kInternal, kOp, p.peer,
                            "chose " + p.transport + ", which this rank did not create");
    }
    RDMAFLOW_LOG_INFO("{}", p.describe());
  }
  return sel;
}

Result<SelectedMesh> connect_selected_mesh(Bootstrap& boot, const std::string& requested,
                                           std::optional<Millis> timeout) {
  const Millis t = timeout.value_or(boot.timeout());
  AllGather ag = [&boot, t](std::span<const uint8_t> mine) { return boot.allgather(mine, t); };
  SelectedMesh out;
  RDMAFLOW_ASSIGN_OR_RETURN(out.selection,
                            select_transports(requested, boot.transport_config(), ag));
  if (boot.world_size() == 1) {
    out.channels.resize(1);
    return out;
  }
  RDMAFLOW_ASSIGN_OR_RETURN(out.channels, boot.connect_mesh(out.selection->selector(), t));
  return out;
}

}  // namespace rdmaflow
