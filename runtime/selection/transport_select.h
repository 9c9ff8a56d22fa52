// Per-peer transport selection: RDMAFLOW_TRANSPORT = auto | verbs | ucx | tcp.
//
//   auto sel = select_transports("auto", boot.transport_config(), allgather);  // collective
//   auto mesh = boot.connect_mesh(sel->selector());   // each pair over its own choice
//   std::printf("%s\n", sel->summary().c_str());      // "rank 1: ucx (same host ...)"
//
// Every rank creates the backends RDMAFLOW_TRANSPORT allows (auto: every backend
// viable here; a name: that one, or an error naming why it is not viable) and
// publishes a capability record: its host identity (hostname, boot id, pid and
// IPC namespaces) and, per backend, whether it is viable (or why not) and what it
// reaches (TransportCapabilities: UCX's transports after UCX_TLS, the verbs
// device and fabric). Each pair is then decided from the two records alone, so
// both ends reach the same answer without talking again:
//
//   1. verbs  when both ranks have a viable device on the same fabric (the same
//             InfiniBand subnet prefix, or both RoCE);
//   2. ucx    when both ranks are on the same host and both UCX contexts have a
//             shared-memory transport (posix, sysv, cma, xpmem, knem), or both
//             have an RDMA transport (rc, ud, dc, ...);
//   3. tcp;
//   4. otherwise the highest-priority backend both ranks allow (RDMAFLOW_TRANSPORT
//      named one on both), or an error when they have none in common.
//
// A job may therefore mix transports: ucx between the ranks of one host, verbs
// or tcp across hosts. Each choice and its reason is logged at info level:
//   "transport to rank 1: ucx (same host 'node7'; UCX shared memory: posix,sysv,cma)".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/rendezvous/bootstrap.h"
#include "transport/transport.h"

namespace rdmaflow {

// Collective exchange: every rank's bytes, by rank.
using AllGather = std::function<Result<std::vector<Bytes>>(std::span<const uint8_t> mine)>;

// RDMAFLOW_TRANSPORT as this process asks for it: `option` when not empty, else
// the environment, else "auto".
std::string requested_transport(const std::string& option = {});

// One backend as a rank reported it.
struct BackendReport {
  std::string name;
  bool viable = false;
  std::string why_not;  // not viable, or not allowed by RDMAFLOW_TRANSPORT
  TransportCapabilities caps;
};

// What one rank publishes before the pairs are decided.
struct RankCapabilities {
  std::string requested;  // that rank's RDMAFLOW_TRANSPORT
  std::string hostname;
  // Equal on two ranks when they share a kernel and the pid and IPC namespaces:
  // shared memory and CMA reach between them. Empty when unknown.
  std::string host_id;
  std::vector<BackendReport> backends;  // by descending priority

  // The report of `name` when it is viable (and allowed) on that rank.
  const BackendReport* usable(const std::string& name) const;

  Bytes encode() const;
  static Result<RankCapabilities> decode(std::span<const uint8_t> bytes);
};

// This process's host identity: hostname and host_id of RankCapabilities.
RankCapabilities local_host_identity();

// The transport of one pair.
struct PeerTransport {
  int peer = -1;
  std::string transport;  // "verbs", "ucx", "tcp"; empty for this rank itself
  // What the pair's data moves over, as the backend answered for the pair;
  // kNone when it does not say (a backend forced on a pair it does not reach).
  Medium medium = Medium::kNone;
  std::string reason;  // why, in words ("same host 'node7'; UCX shared memory: ...")

  // "transport to rank 1: ucx (same host 'node7'; UCX shared memory: posix,sysv,cma)"
  std::string describe() const;
};

// Decides the pair (a, b) from the two records, asking each backend both may
// use whether it reaches the pair (TransportBackendInfo::reaches). Symmetric: the same answer (and
// reason) for (a, b) and (b, a). kNotViable when the two have no backend in common.
Result<PeerTransport> decide_pair(int rank_a, const RankCapabilities& a, int rank_b,
                                  const RankCapabilities& b);

// The outcome of select_transports on one rank: a transport per peer, and the
// transports themselves (only those some peer uses are kept).
class TransportSelection {
 public:
  ~TransportSelection();
  TransportSelection(const TransportSelection&) = delete;
  TransportSelection& operator=(const TransportSelection&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(peers_.size()); }
  const std::string& requested() const { return requested_; }
  // By peer rank; the entry for this rank has an empty transport.
  const std::vector<PeerTransport>& peers() const { return peers_; }
  // Every rank's record, by rank.
  const std::vector<RankCapabilities>& records() const { return records_; }

  // The transport of the channel to `peer`; null for this rank.
  Transport* transport_for(int peer) const;
  // World entries: transport_for(p) for every p.
  std::vector<Transport*> per_peer() const;
  // The distinct transports in use, by descending priority.
  std::vector<Transport*> in_use() const;
  // For Bootstrap::connect_mesh.
  TransportSelector selector() const;

  // "ucx", or "ucx+tcp" when peers use several; "local" for a single rank.
  std::string name() const;
  // One line: "rank 1: ucx (same host 'node7'; ...); rank 2: tcp (...)".
  std::string summary() const;

  // Shuts every transport down (their channels fail with kCancelled). Idempotent;
  // the destructor calls it.
  void shutdown();

 private:
  friend Result<std::unique_ptr<TransportSelection>> select_transports(const std::string&,
                                                                       const TransportConfig&,
                                                                       const AllGather&);
  TransportSelection() = default;

  int rank_ = 0;
  std::string requested_;
  std::vector<PeerTransport> peers_;
  std::vector<RankCapabilities> records_;
  std::vector<std::unique_ptr<Transport>> owned_;  // in use, by descending priority
};

// The first step of select_transports, on this process alone: creates the
// backends `requested` allows and describes them. `error` is set when `requested`
// is unknown or names a backend that is not viable here (the record is complete
// either way). decide_pair(0, record, 1, record) is what auto picks between two
// processes of this host.
struct LocalProbe {
  RankCapabilities record;
  std::vector<std::unique_ptr<Transport>> transports;  // the viable ones, created
  Status error;
};
LocalProbe probe_transports(const std::string& requested, const TransportConfig& config);

// Collective: every rank calls it (each with its own `requested`, which may
// differ between ranks). Fails on every rank alike when a pair has no backend in
// common; fails on this rank when `requested` names a backend that is unknown
// or not viable here (the reason says why), after publishing its record so the
// other ranks fail with an error naming it instead of waiting.
Result<std::unique_ptr<TransportSelection>> select_transports(const std::string& requested,
                                                              const TransportConfig& config,
                                                              const AllGather& allgather);

// select_transports through `boot`, then Bootstrap::connect_mesh over the choice.
struct SelectedMesh {
  std::unique_ptr<TransportSelection> selection;  // owns the transports
  ChannelMesh channels;
};
Result<SelectedMesh> connect_selected_mesh(Bootstrap& boot, const std::string& requested,
                                           std::optional<Millis> timeout = std::nullopt);

}  // namespace rdmaflow
