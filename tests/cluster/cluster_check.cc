// One rank of a job started by a launcher (mpirun, srun, or RDMAFLOW_RANK by
// hand) on the simulated hosts of scripts/cluster: bootstraps from the
// launcher's own variables, lets RDMAFLOW_TRANSPORT (auto unless set) choose
// a transport per peer, checks every channel with a message each way, then
// runs three allreduces and checks their sums, and a reduce_scatter,
// allgather, broadcast and reduce (roots other than 0) of each size and
// barriers.
//
//   mpirun ... -H h0:2,h1:1 cluster_check --expect-split
//   srun -N 2 -n 4 cluster_check
//   mpirun ... -H h0:2,h1:2 cluster_check --algo hier --expect-hosts '2 hosts x 2 ranks'
//
// Prints one line per peer: its host, the transport and the medium the library
// chose (PeerTransport) and why, then "cluster_check: ok ..." on success. The
// communicator's host groups must match the hostnames (--expect-hosts: and
// be the layout given); --algo forces the algorithm of every collective that
// implements (hier implements them all). --expect-split also
// fails unless peers on this host (same hostname) are reached through shared
// memory and peers on other hosts through the network, and unless hostnames and
// the library's host identity (kernel boot, pid and IPC namespaces) agree.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"

namespace {

using namespace std::chrono_literals;
using namespace rdmaflow;

int rank_for_log = -1;

int fail(const std::string& what) {
  std::fprintf(stderr, "cluster_check rank %d: FAILED: %s\n", rank_for_log, what.c_str());
  return 1;
}

int check_mesh(const ChannelMesh& mesh, int me, int world) {
  CompletionGroup sent;
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    mesh[p]->send_message(to_bytes(std::to_string(me) + "->" + std::to_string(p)), sent.add(),
                          20000ms);
  }
  if (Status st = sent.wait(20000ms); !st.is_ok()) return fail(st.to_string());
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    auto msg = mesh[p]->inbox().recv_message(20000ms);
    if (!msg) return fail(msg.status().to_string());
    const std::string expected = std::to_string(p) + "->" + std::to_string(me);
    if (as_string(*msg) != expected) {
      return fail("got '" + as_string(*msg) + "' from rank " + std::to_string(p) + ", expected '" +
                  expected + "'");
    }
  }
  return 0;
}

// Element i of rank r is r + i % 7: every sum is exact in float.
int check_allreduce(Communicator& comm, int me, int world, size_t count, Algorithm algo) {
  std::vector<float> in(count), out(count, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(me + static_cast<int>(i % 7));
  CallOptions o;
  o.algorithm = algo;
  Status st = comm.allreduce(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum, o);
  if (!st.is_ok())
    return fail("allreduce of " + std::to_string(count) + " floats: " + st.to_string());
  const float ranks = static_cast<float>(world * (world - 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    const float want = ranks + static_cast<float>(world * static_cast<int>(i % 7));
    if (out[i] != want) {
      return fail("allreduce of " + std::to_string(count) + " floats: element " +
                  std::to_string(i) + " is " + std::to_string(out[i]) + ", expected " +
                  std::to_string(want));
    }
  }
  return 0;
}

// Element i of rank r's contribution.
float contribution(int r, size_t i) {
  return static_cast<float>(r + static_cast<int>(i % 7));
}

int compare(const std::string& what, const std::vector<float>& got,
            const std::function<float(size_t)>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want(i)) {
      return fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                  ", expected " + std::to_string(want(i)));
    }
  }
  return 0;
}

// reduce_scatter, allgather, broadcast and reduce of `count` floats per rank
// (contribution() again: sums stay exact), then a barrier.
int check_other_collectives(Communicator& comm, int me, int world, size_t count, Algorithm algo) {
  auto opts = [&](CollectiveKind kind) {
    CallOptions o;
    o.algorithm = algorithm_supports(algo, kind) ? algo : Algorithm::kAuto;
    return o;
  };
  const size_t n = static_cast<size_t>(world);
  const float ranks = static_cast<float>(world * (world - 1) / 2);
  auto sum = [&](size_t i) { return ranks + static_cast<float>(world * static_cast<int>(i % 7)); };
  const std::string of = " of " + std::to_string(count) + " floats";
  std::vector<float> in(n * count), out(n * count, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = contribution(me, i);

  std::vector<float> block(count, -1.0f);
  Status st = comm.reduce_scatter(in.data(), block.data(), count, DataType::kF32, ReduceOp::kSum,
                                  opts(CollectiveKind::kReduceScatter));
  if (!st.is_ok()) return fail("reduce_scatter" + of + ": " + st.to_string());
  const size_t first = static_cast<size_t>(me) * count;
  if (int rc = compare("reduce_scatter" + of, block, [&](size_t i) { return sum(first + i); })) {
    return rc;
  }
  st = comm.allgather(in.data(), out.data(), count, DataType::kF32,
                      opts(CollectiveKind::kAllgather));
  if (!st.is_ok()) return fail("allgather" + of + ": " + st.to_string());
  if (int rc = compare("allgather" + of, out, [&](size_t i) {
        return contribution(static_cast<int>(i / count), i % count);
      })) {
    return rc;
  }
  const int root = world - 1, reduce_root = 1 % world;
  std::vector<float> buf(count, -1.0f);
  if (me == root) buf.assign(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(count));
  st = comm.broadcast(buf.data(), buf.data(), count, DataType::kF32, root,
                      opts(CollectiveKind::kBroadcast));
  if (!st.is_ok()) return fail("broadcast" + of + ": " + st.to_string());
  if (int rc = compare("broadcast" + of, buf, [&](size_t i) { return contribution(root, i); })) {
    return rc;
  }
  buf.assign(count, -1.0f);
  st = comm.reduce(in.data(), buf.data(), count, DataType::kF32, ReduceOp::kSum, reduce_root,
                   opts(CollectiveKind::kReduce));
  if (!st.is_ok()) return fail("reduce" + of + ": " + st.to_string());
  if (me == reduce_root) {
    if (int rc = compare("reduce" + of, buf, sum)) return rc;
  }
  st = comm.barrier(opts(CollectiveKind::kBarrier));
  if (!st.is_ok()) return fail("barrier: " + st.to_string());
  return 0;
}

// The communicator's host groups against the hostnames the selection saw:
// ranks share a group exactly when they share a hostname.
int check_host_groups(const Communicator& comm, const TransportSelection& sel, int me,
                      const std::string& expect) {
  const HostGroups& g = comm.host_groups();
  const auto& records = sel.records();
  for (int p = 0; p < comm.world_size(); ++p) {
    const bool same_name =
        records[static_cast<size_t>(p)].hostname == records[static_cast<size_t>(me)].hostname;
    if (same_name != (g.host_of(p) == g.host_of(me))) {
      return fail("host groups (" + g.describe() + ") put rank " + std::to_string(p) + " on " +
                  (same_name ? "another host" : "this host") + ", hostnames say otherwise");
    }
  }
  if (!expect.empty() && g.describe() != expect) {
    return fail("host groups are " + g.describe() + ", expected " + expect);
  }
  return 0;
}

int run(bool expect_split, Algorithm algo, const std::string& expect_hosts) {
  auto boot = Bootstrap::create();
  if (!boot) return fail(boot.status().to_string());
  Bootstrap& b = **boot;
  const int me = b.rank(), world = b.world_size();
  rank_for_log = me;

  auto selected = connect_selected_mesh(b, requested_transport());
  if (!selected) return fail(selected.status().to_string());
  TransportSelection& sel = *selected->selection;
  const RankCapabilities& mine = sel.records()[static_cast<size_t>(me)];
  int wrong = 0;
  for (const PeerTransport& pt : sel.peers()) {
    if (pt.peer == me) continue;
    const RankCapabilities& theirs = sel.records()[static_cast<size_t>(pt.peer)];
    const Medium medium = pt.medium;
    std::printf("cluster_check: rank %d on %s: rank %d on %s: %s over %s (%s)\n", me,
                mine.hostname.c_str(), pt.peer, theirs.hostname.c_str(), pt.transport.c_str(),
                medium_name(medium), pt.reason.c_str());
    if (!expect_split) continue;
    const bool same_name = theirs.hostname == mine.hostname;
    const bool same_id = !mine.host_id.empty() && theirs.host_id == mine.host_id;
    if (same_name != same_id) {
      wrong += fail("rank " + std::to_string(pt.peer) + ": hostnames '" + mine.hostname + "', '" +
                    theirs.hostname + "' but host identities '" + mine.host_id + "', '" +
                    theirs.host_id + "'");
    } else if (same_name && medium != Medium::kSharedMemory) {
      wrong += fail("rank " + std::to_string(pt.peer) + " shares host " + mine.hostname +
                    " but is reached over " + medium_name(medium));
    } else if (!same_name && medium == Medium::kSharedMemory) {
      wrong += fail("rank " + std::to_string(pt.peer) + " is on another host (" + theirs.hostname +
                    ") but is reached over shared memory");
    }
  }
  std::fflush(stdout);
  if (wrong) return 1;
  if (int rc = check_mesh(selected->channels, me, world)) return rc;

  CommunicatorSetup setup;
  setup.rank = me;
  setup.world = world;
  setup.channels = selected->channels;
  setup.transports = sel.per_peer();
  CommunicatorOptions co;
  co.measure = false;
  auto comm = Communicator::create(std::move(setup), co);
  if (!comm) return fail(comm.status().to_string());
  if (int rc = check_host_groups(**comm, sel, me, expect_hosts)) return rc;
  for (size_t count : {size_t{1000}, size_t{100003}, size_t{1} << 18}) {
    if (int rc = check_allreduce(**comm, me, world, count, algo)) return rc;
  }
  for (size_t count : {size_t{1000}, size_t{100003}, size_t{1} << 18}) {
    if (int rc = check_other_collectives(**comm, me, world, count, algo)) return rc;
  }
  const std::string hosts = (*comm)->host_groups().describe();
  // Same-host and other-host peers waited for in one ppoll (RDMAFLOW_COLL_MIXED_WAIT),
  // or, crowded, the other hosts' sockets polled beside the words (RDMAFLOW_COLL_MIXED_POLL).
  const FabricStats st = (*comm)->stats();
  const char* wait = st.mixed_wait   ? "one ppoll"
                     : st.mixed_poll ? "sockets polled beside the words"
                                     : "polling";
  comm->reset();
  if (Status st = b.barrier(); !st.is_ok()) return fail(st.to_string());
  sel.shutdown();
  if (Status st = b.finalize(); !st.is_ok()) return fail(st.to_string());
  std::printf(
      "cluster_check: ok: rank %d of %d on %s (%s, rendezvous %s): %d channels over %s, "
      "host groups %s, allreduce[%s] of 1000, 100003 and 262144 floats correct; "
      "reduce_scatter, allgather, broadcast, reduce and barrier[%s] correct; mixed wait: %s\n",
      me, world, mine.hostname.c_str(), b.rank_info().source.c_str(), b.rendezvous().c_str(),
      world - 1, sel.name().c_str(), hosts.c_str(), std::string(algorithm_name(algo)).c_str(),
      std::string(algorithm_name(algo)).c_str(), wait);
  return 0;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// libpmix keeps a few strings from PMIx_Init past PMIx_Finalize (pmix_rte_init,
// pmix_bfrops_base_value_load). Only those are suppressed, here in the program
// rather than in the library, where the hook would take the place of a user's
// own: leaks of rdmaflow's stay reported.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:pmix_rte_init\nleak:pmix_bfrops_base_value_load\n";
}
#endif

int main(int argc, char** argv) {
  bool expect_split = false;
  Algorithm algo = Algorithm::kAuto;
  std::string expect_hosts;
  for (int i = 1; i < argc; ++i) {
    const std::optional<Algorithm> parsed = std::strcmp(argv[i], "--algo") == 0 && i + 1 < argc
                                                ? parse_algorithm(argv[i + 1])
                                                : std::nullopt;
    if (std::strcmp(argv[i], "--expect-split") == 0) {
      expect_split = true;
    } else if (parsed) {
      algo = *parsed;
      ++i;
    } else if (std::strcmp(argv[i], "--expect-hosts") == 0 && i + 1 < argc) {
      expect_hosts = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: cluster_check [--expect-split] [--algo ALGORITHM] "
                   "[--expect-hosts '2 hosts x 2 ranks']\n");
      return 2;
    }
  }
  return run(expect_split, algo, expect_hosts);
}
