// Bootstrap: how the processes of a job find each other.
//
//   auto boot = Bootstrap::create();           // rank, world, rendezvous store
//   auto tcp = make_transport("tcp", (*boot)->transport_config());
//   auto mesh = (*boot)->connect_mesh(**tcp);  // channels[peer], none for self
//
// Rank and world come from runtime/rendezvous/rank_info.h. With more than one rank, rank 0
// serves a TcpStore at RDMAFLOW_RENDEZVOUS and every rank is its client; one rank
// alone uses an in-process store. Unset, the rendezvous is 127.0.0.1 when every
// rank is on this host, else found through the launcher
// (runtime/rendezvous/launcher_rendezvous.h). create() returns once every rank has joined.
//
// barrier, allgather and connect_mesh are collective: every rank calls them, in
// the same order. Each has a timeout (RDMAFLOW_TIMEOUT_MS by default) and, on
// failure, an error naming what was missing.
//
// A Bootstrap is used from one thread at a time (its collectives are numbered in
// call order); its store may be shared by many threads, whose calls are serialized.
//
// Lifetime: destroying a Bootstrap says goodbye to the store; rank 0 keeps serving
// until every rank said goodbye (or the timeout passes), so a rank still reading
// the store never finds it gone. Channels from connect_mesh belong to their
// transport and outlive the Bootstrap.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/rendezvous/rank_info.h"
#include "runtime/rendezvous/store.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow {

class TcpStore;
class TcpStoreServer;

// Used when RDMAFLOW_RENDEZVOUS is unset, world > 1 and every rank is on this host.
inline constexpr const char* kDefaultLocalRendezvous = "127.0.0.1:29500";

struct BootstrapOptions {
  std::optional<RankInfo> rank_info;      // default: detect_rank_info()
  std::optional<std::string> rendezvous;  // default: RDMAFLOW_RENDEZVOUS, see above
  std::optional<Millis> timeout;          // default: RDMAFLOW_TIMEOUT_MS
  // A store the caller already shares with every rank (torch.distributed's
  // TCPStore, through python/): the bootstrap meets there instead of at
  // RDMAFLOW_RENDEZVOUS and rank 0 serves nothing. Keys go under "rdmaflow/"
  // and "user/" as on the bootstrap's own store.
  std::shared_ptr<Store> store;
  // With `store`, ranks on several hosts: a host name or address of rank 0's
  // host (torch's MASTER_ADDR), so that socket transports listen on the
  // interface that reaches it. Empty: loopback, as on one host.
  std::optional<std::string> reach_toward;
};

// Channels indexed by peer rank; the entry for this rank is null.
using ChannelMesh = std::vector<std::shared_ptr<Channel>>;

// Chooses the transport for the channel to `peer`. Both ends of a pair must pick
// transports with the same name(); may return the same transport for many peers.
using TransportSelector = std::function<Transport*(int peer)>;

class Bootstrap {
 public:
  static Result<std::unique_ptr<Bootstrap>> create(BootstrapOptions options = {});
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  const RankInfo& rank_info() const { return info_; }
  // "host:port" of the rendezvous; empty for a single process.
  const std::string& rendezvous() const { return rendezvous_; }
  Millis timeout() const { return timeout_; }

  // The job-wide store, in a namespace of its own ("user/"); layers above take
  // their own PrefixStore from it.
  Store& store() { return *user_store_; }
  std::shared_ptr<Store> shared_store() { return user_store_; }

  // Returns once every rank has called barrier (the n-th call of each rank meets
  // the n-th of the others).
  Status barrier(std::optional<Millis> timeout = std::nullopt);

  // Every rank's `mine`, indexed by rank.
  Result<std::vector<Bytes>> allgather(std::span<const uint8_t> mine,
                                       std::optional<Millis> timeout = std::nullopt);

  // A TransportConfig for this process: rank, world, RDMAFLOW_SOCKET_IFNAME, timeout,
  // and, when the ranks may span hosts, the local address that reaches the
  // rendezvous (where socket transports listen unless told otherwise).
  TransportConfig transport_config() const;

  // Builds a full mesh of channels over `transport`: every rank publishes its
  // listen() address; for each pair the higher rank connects and the lower
  // accepts. Returns once every rank built its channels, or an error naming the
  // rank and peer that failed (on every rank, so nobody is left waiting).
  Result<ChannelMesh> connect_mesh(Transport& transport,
                                   std::optional<Millis> timeout = std::nullopt);
  // The same, with a transport chosen per peer.
  Result<ChannelMesh> connect_mesh(const TransportSelector& select,
                                   std::optional<Millis> timeout = std::nullopt);

  // Says goodbye; on rank 0 also waits (up to `timeout`) for every rank's goodbye,
  // then stops the server. Idempotent; the destructor calls it and logs failures.
  Status finalize(std::optional<Millis> timeout = std::nullopt);

 private:
  Bootstrap() = default;
  Status join(Millis timeout);

  RankInfo info_;
  std::string rendezvous_;
  std::string reach_address_;  // empty on one host
  Millis timeout_{30000};
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 of a multi-rank job
  std::shared_ptr<TcpStore> tcp_store_;     // when world > 1
  std::shared_ptr<Store> root_store_;
  std::shared_ptr<Store> internal_;    // "rdmaflow/" keys of the bootstrap itself
  std::shared_ptr<Store> user_store_;  // "user/"
  uint64_t barriers_ = 0;
  uint64_t allgathers_ = 0;
  uint64_t meshes_ = 0;
  bool finalized_ = true;  // until create() has joined
};

}  // namespace rdmaflow
