// Transport: one per backend per process. It registers memory (it is the
// arena's MemoryRegistrar), exports RemoteKeys, and creates one Channel per
// peer. Backends plug in through TransportRegistry with a priority, the way
// TensorPipe negotiates its transports.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator/registrar.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/remote_key.h"

namespace rdmaflow {

struct TransportConfig {
  int rank = 0;        // this process's rank, sent in the connection hello
  int world_size = 1;  // informational
  // Interface or address to listen on (RDMAFLOW_SOCKET_IFNAME / explicit). Empty =
  // loopback-or-auto.
  std::string ifname;
  // Where socket transports listen when `ifname` is empty: the local address that
  // reaches the rendezvous, set by the bootstrap when the ranks may span hosts.
  // Empty: loopback, as on one host.
  std::string reach_address;
  // Default deadline for connection setup.
  Millis connect_timeout{30000};
};

// What a backend can tell about how it reaches peers, for per-peer selection
// (runtime/selection/transport_select.h). A backend with nothing to say keeps the default.
struct TransportCapabilities {
  // The lower-level transports the backend may use, as the backend names them.
  // UCX: its context's resources after UCX_TLS ("posix", "sysv", "cma", "tcp",
  // "rc_verbs", ...).
  std::vector<std::string> components;
  // The device, for logs ("rxe0 port 1 (RoCE, mtu 1024), GID index 1 ...").
  std::string device;
  // What the device reaches (verbs: "ib <subnet prefix>", "roce <IPv4 subnet>",
  // or "roce" when the subnet is unknown); the backend's ReachFunction says
  // whether two ranks' devices reach each other.
  std::string fabric;
};

// The medium a backend would move a pair's data over; a better one compares greater.
enum class Medium : uint8_t { kNone = 0, kSocket, kRdma, kSharedMemory };
// "shared memory", "RDMA", "socket", "none": for tables and logs.
const char* medium_name(Medium medium);

// One rank of a pair, as transport selection sees it: what that rank published.
struct Endpoint {
  int rank = -1;
  std::string hostname;
  const TransportCapabilities* caps = nullptr;
};

// A backend's answer for one pair: the medium and a sentence naming the path
// ("UCX shared memory: posix,cma"), or kNone and why not.
struct Reach {
  Medium medium = Medium::kNone;
  std::string reason;
};

// Does the backend connect ranks `a` and `b`, and over what (NCCL's
// canConnect)? Judged from what both ranks published, so each end of the pair
// computes the same answer. `same_host`: both share a kernel and the pid and
// IPC namespaces. Pure and cheap; called with both ranks in rank order.
using ReachFunction = std::function<Reach(const Endpoint& a, const Endpoint& b, bool same_host)>;

class Transport : public MemoryRegistrar {
 public:
  ~Transport() override = default;

  virtual std::string name() const = 0;

  // See TransportCapabilities. Cheap; callable from any thread.
  virtual TransportCapabilities capabilities() const { return {}; }

  // Starts listening (idempotent) and returns the address peers pass to connect().
  // The format is backend specific and opaque to callers.
  virtual Result<std::string> listen() = 0;

  // Connects to `peer_rank` listening at `address`. Fails with kConnectionFailed
  // or kTimeout within `timeout` when nobody answers.
  virtual Result<std::shared_ptr<Channel>> connect(int peer_rank, const std::string& address,
                                                   Millis timeout) = 0;

  // Waits for `peer_rank` to connect to this transport's listener.
  virtual Result<std::shared_ptr<Channel>> accept(int peer_rank, Millis timeout) = 0;

  // Grants access to [addr, addr + len), which must lie inside one region
  // registered with this transport.
  virtual Result<RemoteKey> export_key(const void* addr, size_t len) = 0;

  // Revokes a grant; later accesses with it are refused. On tcp and ucx it is a
  // fence: when it returns, no access with the key is still running either (a
  // write arriving is refused for the rest, a read being answered ends with a
  // refusal, or on tcp, when caught mid-frame, fails its channel). On verbs an
  // RDMA access the peer already posted may still land (the NIC checks only the
  // slab's rkey); deregister_memory() is the fence there, as it is everywhere.
  virtual Status revoke_key(const RemoteKey& key) = 0;

  // Closes every channel (pending operations fail with kCancelled) and stops
  // the progress thread. Idempotent; the destructor calls it.
  virtual void shutdown() = 0;
};

// Backend registry, by name ("tcp", "ucx", "verbs"). A factory returns
// kNotViable with the reason when the backend cannot run on this machine.
using TransportFactory = std::function<Result<std::unique_ptr<Transport>>(const TransportConfig&)>;

struct TransportBackendInfo {
  std::string name;
  int priority = 0;  // among backends reaching a pair over one medium, higher wins
  TransportFactory factory;
  ReachFunction reaches;  // null: reaches every peer over a socket
};

void register_transport_backend(TransportBackendInfo info);
std::vector<std::string> transport_backend_names();  // by descending priority
// The registered backend's answer for a pair; kNone naming the backend when unknown.
Reach transport_reach(const std::string& name, const Endpoint& a, const Endpoint& b,
                      bool same_host);

// One way to run a backend, for callers that want a row per medium (the
// conformance suite, benchmarks): the backend as it is, or pinned to one medium
// through the environment it is created in (UCX reads UCX_TLS at creation).
struct TransportVariant {
  std::string label;    // "ucx_shm"; the backend's name for the backend as it is
  std::string backend;  // the name make_transport() takes
  // Set before make_transport().
  std::vector<std::pair<std::string, std::string>> env;
  // env restricts the backend to one medium.
  bool pinned = false;
  // One of the rows that name each medium once: the pinned rows of a backend
  // that has some, else the backend as it is.
  bool per_medium = false;
  // On one host, data moves through memory.
  bool shared_memory = false;
  // False: this source tree has the backend, this build left it out.
  bool built = true;
};

// Every registered backend as it is and pinned to each medium it names, by
// descending priority; then the backends this build left out (built = false),
// so that callers can say "not built" instead of "unknown". The pinned rows are
// meant for ranks on one host (ucx_tcp stays on lo).
std::vector<TransportVariant> transport_variants();
Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportConfig& config);

}  // namespace rdmaflow
