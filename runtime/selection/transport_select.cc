#include "runtime/selection/transport_select.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/env.h"
#include "common/log.h"
#include "runtime/session/session_layout.h"

namespace rdmaflow {

namespace {

constexpr const char* kOp = "select transports";
constexpr uint32_t kRecordVersion = 1;

// UCX transports that reach another process through memory on the same host.
bool is_ucx_shared_memory(const std::string& tl) {
  return tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" || tl == "knem";
}

// UCX transports that move data over an RDMA device (rc_verbs, ud_mlx5, dc_mlx5, ...).
bool is_ucx_rdma(const std::string& tl) {
  for (const char* p : {"rc", "ud", "dc"}) {
    const std::string prefix = p;
    if (tl == prefix || tl.rfind(prefix + "_", 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> filter(const std::vector<std::string>& tls,
                                bool (*keep)(const std::string&)) {
  std::vector<std::string> out;
  for (const auto& t : tls) {
    if (keep(t)) out.push_back(t);
  }
  return out;
}

std::vector<std::string> common(const std::vector<std::string>& a,
                                const std::vector<std::string>& b) {
  std::vector<std::string> out;
  for (const auto& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) out.push_back(x);
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string rank_text(int r) {
  return "rank " + std::to_string(r);
}

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

bool fabrics_reach(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  const auto roce = [](const std::string& f) { return f == "roce" || f.starts_with("roce "); };
  return roce(a) && roce(b) && (a == "roce" || b == "roce");
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

  // Both ranks named one backend: that is what the user asked for.
  if (a.requested == b.requested && a.requested != "auto" && a.usable(a.requested) &&
      b.usable(b.requested)) {
    out.transport = a.requested;
    out.reason = "RDMAFLOW_TRANSPORT=" + a.requested + " on both ranks";
    return out;
  }

  std::vector<std::string> why_not;
  const BackendReport* ua = a.usable("ucx");
  const BackendReport* ub = b.usable("ucx");
  const bool same_host = !a.host_id.empty() && a.host_id == b.host_id;
  // 1. Shared memory on one host: a memcpy beats any NIC loopback (as NCCL
  //    takes P2P/SHM over NET within a node), even where an RDMA device exists.
  if (same_host && ua && ub) {
    const auto shm = common(filter(ua->caps.components, is_ucx_shared_memory),
                            filter(ub->caps.components, is_ucx_shared_memory));
    if (!shm.empty()) {
      out.transport = "ucx";
      out.reason = "same host '" + a.hostname + "'; UCX shared memory: " + join(shm);
      return out;
    }
  }

  // 2. verbs: both have a device, on the same fabric.
  const BackendReport* va = a.usable("verbs");
  const BackendReport* vb = b.usable("verbs");
  if (va && vb) {
    if (fabrics_reach(va->caps.fabric, vb->caps.fabric)) {
      // The more specific of the two names (they differ only when one RoCE
      // subnet is unknown), so the reason reads the same from both ends.
      const std::string& fabric =
          va->caps.fabric.size() >= vb->caps.fabric.size() ? va->caps.fabric : vb->caps.fabric;
      out.transport = "verbs";
      out.reason = "RDMA devices on one fabric (" + fabric + "): " + rank_text(ra) + " " +
                   va->caps.device + "; " + rank_text(rb) + " " + vb->caps.device;
      return out;
    }
    why_not.push_back("verbs devices on different fabrics ('" + va->caps.fabric + "' and '" +
                      vb->caps.fabric + "')");
  } else {
    why_not.push_back(pair_unusable(ra, a, rb, b, "verbs"));
  }

  // 3. ucx: RDMA on both (shared memory on one host was taken above).
  if (ua && ub) {
    const auto shm_a = filter(ua->caps.components, is_ucx_shared_memory);
    const auto shm_b = filter(ub->caps.components, is_ucx_shared_memory);
    const auto rdma_a = filter(ua->caps.components, is_ucx_rdma);
    const auto rdma_b = filter(ub->caps.components, is_ucx_rdma);
    if (!rdma_a.empty() && !rdma_b.empty()) {
      out.transport = "ucx";
      const auto both = common(rdma_a, rdma_b);
      out.reason =
          "UCX RDMA transports: " + (both.empty() ? rank_text(ra) + " " + join(rdma_a) + ", " +
                                                        rank_text(rb) + " " + join(rdma_b)
                                                  : join(both));
      if (same_host) out.reason += " (same host '" + a.hostname + "', no common UCX shared memory)";
      return out;
    }
    auto list = [](const BackendReport* r) {
      return r->caps.components.empty() ? std::string("none") : join(r->caps.components);
    };
    if (same_host) {
      std::string who;
      if (shm_a.empty()) who = rank_text(ra) + " (UCX transports: " + list(ua) + ")";
      if (shm_b.empty()) {
        who += (who.empty() ? "" : " and ") + rank_text(rb) + " (UCX transports: " + list(ub) + ")";
      }
      why_not.push_back(who.empty() ? "no UCX shared-memory transport common to both ranks"
                                    : "no UCX shared memory on " + who);
    } else {
      why_not.push_back("different hosts ('" + a.hostname + "', '" + b.hostname +
                        "') and no UCX RDMA transport on " +
                        (rdma_a.empty() && rdma_b.empty() ? std::string("either rank")
                         : rdma_a.empty()                 ? rank_text(ra)
                                                          : rank_text(rb)));
    }
  } else {
    why_not.push_back(pair_unusable(ra, a, rb, b, "ucx"));
  }

  // 4. tcp.
  if (a.usable("tcp") && b.usable("tcp")) {
    out.transport = "tcp";
    out.reason = join(why_not, "; ");
    return out;
  }
  why_not.push_back(pair_unusable(ra, a, rb, b, "tcp"));

  // 5. Whatever both allow, best first (e.g. RDMAFLOW_TRANSPORT=ucx across hosts).
  for (const auto& backend : a.backends) {
    if (a.usable(backend.name) && b.usable(backend.name)) {
      out.transport = backend.name;
      out.reason = "the only backend both ranks allow (" + join(why_not, "; ") + ")";
      return out;
    }
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
