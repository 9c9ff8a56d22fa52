// Helpers for the collectives process tests: a rank's transport, channels to
// every peer and Communicator, over a backend row (tests/support/backends.h);
// and a checker that caches expected results so big matrices stay fast.
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/algorithms/registry.h"
#include "collectives/communicator.h"
#include "tests/collectives/reference.h"
#include "tests/support/backends.h"
#include "tests/support/process.h"
#include "transport/transport.h"

namespace rdmaflow::testing {

struct CommNode {
  std::unique_ptr<Transport> transport;
  std::vector<std::shared_ptr<Channel>> peers;
  std::unique_ptr<Communicator> comm;

  ~CommNode() {
    comm.reset();
    if (transport) transport->shutdown();
  }
};

// Destroys the node's communicator (if any), then makes a new one on the
// same mesh.
inline Status renew_comm(CommNode& node, int rank, int world,
                         const CommunicatorOptions& options = {}) {
  node.comm.reset();
  CommunicatorSetup setup;
  setup.rank = rank;
  setup.world = world;
  setup.channels = node.peers;
  setup.transport = node.transport.get();
  RDMAFLOW_ASSIGN_OR_RETURN(node.comm, Communicator::create(setup, options));
  return Status::ok();
}

// Builds the mesh over `backend` and the communicator; skips the rank (and so
// the test) when the backend is not built or not viable here.
inline Status make_comm_node(const BackendRow& backend, int rank, int world, Exchange& ex,
                             CommNode& node, CommunicatorOptions options = {}) {
  TransportConfig cfg;
  cfg.rank = rank;
  cfg.world_size = world;
  RDMAFLOW_ASSIGN_OR_RETURN(node.transport, make_row_transport(backend, cfg, ex));
  RDMAFLOW_ASSIGN_OR_RETURN(node.peers, connect_mesh(*node.transport, rank, world, ex));
  return renew_comm(node, rank, world, options);
}

// 2 simulated hosts x 2 ranks as the cluster has them: same-host peers
// (ranks 2h, 2h + 1) over UCX shared memory (the direct path), the others
// over tcp; host_key says which host a rank is on.
struct TwoHostNode {
  std::unique_ptr<Transport> tcp, shm;
  std::unique_ptr<Communicator> comm;

  ~TwoHostNode() {
    comm.reset();
    if (shm) shm->shutdown();
    if (tcp) tcp->shutdown();
  }
};

inline Status make_two_host_node(int rank, int world, Exchange& ex, TwoHostNode& node,
                                 CommunicatorOptions options = {}) {
  TransportConfig cfg;
  cfg.rank = rank;
  cfg.world_size = world;
  RDMAFLOW_ASSIGN_OR_RETURN(node.tcp, make_row_transport(backend_row("tcp"), cfg, ex));
  RDMAFLOW_ASSIGN_OR_RETURN(node.shm, make_row_transport(backend_row("ucx_shm"), cfg, ex));
  RDMAFLOW_ASSIGN_OR_RETURN(auto tcp_peers, connect_mesh(*node.tcp, rank, world, ex));
  RDMAFLOW_ASSIGN_OR_RETURN(auto shm_peers, connect_mesh(*node.shm, rank, world, ex));
  CommunicatorSetup setup;
  setup.rank = rank;
  setup.world = world;
  setup.channels.resize(world);
  setup.transports.assign(world, nullptr);
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    const bool same_host = p / 2 == rank / 2;
    setup.channels[p] = (same_host ? shm_peers : tcp_peers)[p];
    setup.transports[p] = same_host ? node.shm.get() : node.tcp.get();
  }
  options.host_key = static_cast<uint64_t>(rank / 2);
  RDMAFLOW_ASSIGN_OR_RETURN(node.comm, Communicator::create(setup, options));
  return Status::ok();
}

// 64-byte aligned, zeroed memory.
struct Mem {
  explicit Mem(size_t n = 0) { resize(n); }
  ~Mem() { std::free(p); }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  void resize(size_t n) {
    std::free(p);
    bytes = n;
    p = static_cast<std::byte*>(std::aligned_alloc(64, (n + 64) / 64 * 64));
    std::memset(p, 0, (n + 64) / 64 * 64);
  }
  std::byte* p = nullptr;
  size_t bytes = 0;
};

// One collective call, checked against the local reference.
struct CallSpec {
  CollectiveKind kind;
  Algorithm algo;
  DataType type;
  ReduceOp op;
  size_t count;
  int root = 0;
  bool in_place = false;
  uint32_t seed = 1;
};

inline std::string describe(const CallSpec& c, int world) {
  return std::string(collective_name(c.kind)) + "[" + std::string(algorithm_name(c.algo)) +
         "] world " + std::to_string(world) + " count " + std::to_string(c.count) + " " +
         std::string(dtype_name(c.type)) + " " + std::string(reduce_op_name(c.op)) + " root " +
         std::to_string(c.root) + (c.in_place ? " in-place" : "");
}

// Runs one call on this rank and returns the number of wrong elements
// (or an error). `first` describes the first wrong element.
inline Result<size_t> run_and_check(Communicator& comm, const CallSpec& c, std::string* first,
                                    std::optional<Millis> timeout = std::nullopt) {
  const int world = comm.world_size(), rank = comm.rank();
  const size_t es = dtype_size(c.type);
  const size_t in_elems = test::input_elems(c.kind, c.count, world);
  const size_t out_elems = test::output_elems(c.kind, c.count, world);
  Mem in(in_elems * es), out(std::max(in_elems, out_elems) * es);
  test::make_input(c.kind, c.type, c.op, rank, world, c.seed, in.p, c.count);
  const std::byte* src = in.p;
  std::byte* dst = out.p;
  if (c.in_place) {
    switch (c.kind) {
      case CollectiveKind::kAllgather:
        std::memcpy(out.p + rank * c.count * es, in.p, c.count * es);
        src = out.p + rank * c.count * es;
        break;
      case CollectiveKind::kReduceScatter:
        std::memcpy(out.p, in.p, in_elems * es);
        src = out.p;
        dst = out.p + rank * c.count * es;
        break;
      default:
        std::memcpy(out.p, in.p, in_elems * es);
        src = dst = out.p;
        break;
    }
  }
  CallOptions o;
  o.algorithm = c.algo;
  o.timeout = timeout;
  if (c.kind == CollectiveKind::kBroadcast && rank != c.root && !c.in_place) src = nullptr;
  RDMAFLOW_RETURN_IF_ERROR(comm.run(c.kind, src, dst, c.count, c.type, c.op, c.root, o));
  return test::check_output(c.kind, c.type, c.op, rank, world, c.root, c.seed, dst, c.count, first);
}

// Expected reductions, computed once per (type, op, seed, elements) and reused
// by every algorithm of a matrix (the per-element reference costs a loop over
// the world).
class ReferenceCache {
 public:
  const std::vector<double>& reduced(DataType t, ReduceOp op, int world, uint32_t seed,
                                     size_t elems) {
    auto key = std::make_tuple(static_cast<int>(t), static_cast<int>(op), world, seed, elems);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    if (cache_.size() > 8) cache_.clear();
    std::vector<double> v(elems);
    for (size_t i = 0; i < elems; ++i) v[i] = test::reduced_value(t, op, world, i, seed);
    return cache_.emplace(key, std::move(v)).first->second;
  }

 private:
  std::map<std::tuple<int, int, int, uint32_t, size_t>, std::vector<double>> cache_;
};

// run_and_check as a Status: an error naming the call (after `context`), how
// many elements are wrong and the first of them, when any is.
inline Status check_call(Communicator& comm, const CallSpec& c, const std::string& context = "") {
  std::string first;
  RDMAFLOW_ASSIGN_OR_RETURN(size_t wrong, run_and_check(comm, c, &first));
  if (wrong == 0) return Status::ok();
  return RDMAFLOW_ERROR(Code::kInternal, "check result", comm.rank(),
                        context + describe(c, comm.world_size()) + ": " + std::to_string(wrong) +
                            " wrong elements, the first " + first);
}

// Like run_and_check, but reductions are compared against `cache`.
inline Result<size_t> run_and_check_cached(Communicator& comm, const CallSpec& c,
                                           ReferenceCache& cache, std::string* first) {
  const bool reduced = c.kind == CollectiveKind::kAllreduce ||
                       c.kind == CollectiveKind::kReduceScatter ||
                       c.kind == CollectiveKind::kReduce;
  if (!reduced || c.count < 4096) return run_and_check(comm, c, first);
  const int world = comm.world_size(), rank = comm.rank();
  const size_t es = dtype_size(c.type);
  const size_t in_elems = test::input_elems(c.kind, c.count, world);
  Mem in(in_elems * es), out(in_elems * es);
  test::make_input(c.kind, c.type, c.op, rank, world, c.seed, in.p, c.count);
  const std::byte* src = in.p;
  std::byte* dst = out.p;
  if (c.in_place) {
    std::memcpy(out.p, in.p, in_elems * es);
    src = out.p;
    if (c.kind == CollectiveKind::kReduceScatter) dst = out.p + rank * c.count * es;
  }
  CallOptions o;
  o.algorithm = c.algo;
  RDMAFLOW_RETURN_IF_ERROR(comm.run(c.kind, src, dst, c.count, c.type, c.op, c.root, o));
  if (c.kind == CollectiveKind::kReduce && rank != c.root) return size_t{0};
  const auto& want = cache.reduced(c.type, c.op, world, c.seed, in_elems);
  const size_t offset = c.kind == CollectiveKind::kReduceScatter ? rank * c.count : 0;
  size_t wrong = 0;
  for (size_t i = 0; i < c.count; ++i) {
    const double got = test::load(c.type, dst, i);
    if (!test::close_enough(c.type, c.op, want[offset + i], got)) {
      if (wrong == 0 && first) {
        *first = "element " + std::to_string(offset + i) + ": want " +
                 std::to_string(want[offset + i]) + " got " + std::to_string(got);
      }
      ++wrong;
    }
  }
  return wrong;
}

}  // namespace rdmaflow::testing
