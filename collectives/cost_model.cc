#include "collectives/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "collectives/algorithms/registry.h"
#include "collectives/topology.h"

namespace rdmaflow {

std::string CostParams::to_string() const {
  char buf[224];
  int len = std::snprintf(buf, sizeof(buf), "alpha=%.2fus beta=%.3fns/B (%.2f GB/s) gamma=%.3fns/B",
                          alpha * 1e6, beta * 1e9, beta > 0 ? 1e-9 / beta : 0.0, gamma * 1e9);
  if (round > 0 && len > 0 && static_cast<size_t>(len) < sizeof(buf)) {
    len += std::snprintf(buf + len, sizeof(buf) - static_cast<size_t>(len), " round=%.1fus",
                         round * 1e6);
  }
  if (gamma_cold > 0 && len > 0 && static_cast<size_t>(len) < sizeof(buf)) {
    len += std::snprintf(buf + len, sizeof(buf) - static_cast<size_t>(len),
                         " (%.3f out of %zu KiB cache)", gamma_cold * 1e9, cache_bytes >> 10);
  }
  if (cpus > 0 && len > 0 && static_cast<size_t>(len) < sizeof(buf)) {
    std::snprintf(buf + len, sizeof(buf) - static_cast<size_t>(len), " crowded on %d CPUs", cpus);
  }
  return buf;
}

double CostParams::gamma_at(double bytes) const {
  const double touched = 3 * bytes, cache = static_cast<double>(cache_bytes);
  if (gamma_cold <= 0 || touched <= cache) return gamma;
  return (cache * gamma + (touched - cache) * gamma_cold) / touched;
}

size_t call_piece_bytes(size_t total, int world, size_t smallest, size_t largest) {
  // (std::clamp needs lo <= hi: a slot may be smaller than 64 KiB.)
  smallest = std::min(smallest, largest);
  // Two ranks exchange every message both ways at once, each on its own CPU:
  // a second piece already lets the peer start on the first, and each further
  // one only adds a frame, a credit and a wake-up (see cost_model.h).
  const size_t per_share = world == 2 ? 2 : 4;
  return std::clamp<size_t>(total / (static_cast<size_t>(std::max(world, 1)) * per_share), smallest,
                            largest);
}

std::vector<Algorithm> algorithms_for(CollectiveKind kind) {
  std::vector<Algorithm> out;
  for (const AlgorithmInfo& info : algorithm_table()) {
    if (info.implements(kind)) out.push_back(info.id);
  }
  return out;
}

CostTerms CostModel::terms(size_t bytes) const {
  CostTerms t;
  const int pof2 = floor_pow2(world_);
  t.n = world_;
  t.m = static_cast<double>(bytes);
  t.a = p_.alpha;
  t.b = p_.beta;
  t.g = p_.gamma_at(t.m);
  t.p = pof2;
  t.lgp = std::log2(t.p);
  t.lg = ceil_log2(world_);
  t.folded = pof2 != world_;
  t.k = static_cast<double>(p_.piece_bytes);
  t.q = two_level() ? per_host_ : 1;
  t.ha = two_level() ? within_.alpha : t.a;
  t.hb = two_level() ? within_.beta : t.b;
  t.model = this;
  return t;
}

CostTerms CostModel::work_terms(size_t bytes) const {
  CostTerms t = terms(bytes);
  t.k = static_cast<double>(
      call_piece_bytes(bytes, world_, p_.min_piece_bytes, std::max<size_t>(1, p_.piece_bytes)));
  return t;
}

double CostModel::rounds(CollectiveKind kind, Algorithm algo) const {
  if (world_ <= 1) return 0;
  const AlgorithmInfo* info = find_algorithm(algo);
  return info ? info->rounds(kind, terms(0)) : 0;
}

double CostModel::cost(CollectiveKind kind, Algorithm algo, size_t bytes) const {
  const AlgorithmInfo* info = find_algorithm(algo);
  if (info == nullptr || !info->implements(kind)) return std::numeric_limits<double>::infinity();
  if (world_ <= 1) return 0;
  const CostTerms t = terms(bytes);
  // Crowded ranks: the throughput of every rank's sends over the CPUs and the
  // chain of the call (Work), where the algorithm says what they are for the
  // kind (allreduce); the longest chain of rounds otherwise. The work counts
  // the pieces the call is really cut into (work_terms). Of equal work and
  // chain (ring, tree, Rabenseifner and hier from a few pieces up), the
  // shorter path: kPathShare of it, its alpha the crowded message's (hier's
  // parallel lanes: 1.3x faster than the tree on 2 hosts x 2 ranks at 16 MiB
  // on the quiet machine, which sends, reduces and fills as much;
  // docs/benchmarks.md, "Network targets in one run").
  if (crowded() && info->work != nullptr) {
    const Work w = info->work(kind, work_terms(bytes));
    if (w.messages + w.host_messages > 0) {
      const CostModel paths = crowded_paths();
      const double path = paths.cost(kind, algo, bytes);
      return p_.round * info->rounds(kind, t) + crowded(w, t.g) + kPathShare * path;
    }
  }
  return p_.round * info->rounds(kind, t) + info->cost(kind, t);
}

double CostModel::message_seconds(const CostParams& level) {
  return kMessageBytes * level.beta;
}

CostModel CostModel::crowded_paths() const {
  CostParams link = p_, host = within_;
  link.alpha = message_seconds(p_);
  host.alpha = message_seconds(within_);
  link.cpus = host.cpus = 0;
  link.round = host.round = 0;
  CostModel m = *this;
  m.p_ = link;
  m.within_ = host;
  return m;
}

double CostModel::crowded(const Work& w, double gamma) const {
  return crowded_terms(w, gamma).total();
}

CostModel::CrowdedTerms CostModel::crowded_terms(const Work& w, double gamma) const {
  const auto seconds = [&](double msgs, double bytes, double host_msgs, double host_bytes,
                           double memory) {
    return msgs * message_seconds(p_) + bytes * p_.beta + host_msgs * message_seconds(within_) +
           host_bytes * within_.beta + memory * gamma;
  };
  const double cpus = std::max(1, p_.cpus);
  CrowdedTerms t;
  t.messages = seconds(w.messages, 0, w.host_messages, 0, 0) / cpus;
  t.bytes = seconds(0, w.bytes, 0, w.host_bytes, 0) / cpus;
  t.memory = seconds(0, 0, 0, 0, w.reduced + w.copied) / cpus;
  t.chain = w.chain * p_.beta + w.host_chain * within_.beta;
  if (w.uneven) {
    const double bulk = seconds(0, w.bytes, 0, w.host_bytes, w.reduced + w.copied);
    const double top = seconds(0, w.top_bytes, 0, w.top_host_bytes, w.top_memory);
    // What one CPU runs of the sums: a rank's share with a CPU per rank,
    // more with more ranks than CPUs (cost_model.h).
    const double per_cpu = bulk / std::min(cpus, static_cast<double>(std::max(1, world_)));
    t.excess = std::max(0.0, top - per_cpu);
  }
  return t;
}

Algorithm CostModel::choose(CollectiveKind kind, size_t bytes) const {
  const std::vector<Ranked> r = ranked(kind, bytes);
  return r.empty() ? Algorithm::kAuto : r.front().algo;
}

namespace {

// A phase of hier costed by its own path: no round term (hier counts its
// rounds once, over the phases) and not crowded (hier's crowded cost is its
// whole work, hier_work, not a phase's).
CostParams path_only(CostParams p) {
  p.round = 0;
  p.cpus = 0;
  return p;
}

}  // namespace

Algorithm CostModel::between_hosts(size_t block_bytes) const {
  return between_hosts(CollectiveKind::kAllreduce, block_bytes);
}

// The lanes' algorithm by its path, not by its work on crowded CPUs: the
// work of hier as a whole is what the crowded model weighs (hier_work), and
// within it every lane algorithm moves the same bytes, so the crowded costs of
// the lanes tie and the choice fell to noise (tree at 1 MiB, Rabenseifner at
// 16 MiB on 2 hosts x 2 ranks). By the path, 2 hosts take recursive doubling
// (one exchange each way at once): on 2 x 2, 0.6-0.9x the time of hier with
// ring lanes from 64 KiB to 16 MiB in the same runs (docs/benchmarks.md,
// "Hierarchical collectives (2 hosts x 2 ranks)").
Algorithm CostModel::between_hosts(CollectiveKind kind, size_t lane_bytes) const {
  CostParams link = p_;
  link.beta *= per_host_;  // the host's lanes share its link
  link.cpus = 0;
  return CostModel(hosts_, link).choose(kind, lane_bytes);
}

CostModel::Estimate CostModel::hier_estimate(Algorithm between, size_t bytes) const {
  return hier_estimate(CollectiveKind::kAllreduce, between, bytes);
}

CostModel::Estimate CostModel::hier_estimate(CollectiveKind kind, Algorithm between,
                                             size_t bytes) const {
  using K = CollectiveKind;
  Estimate e;
  if (!two_level()) {
    e.seconds = std::numeric_limits<double>::infinity();
    return e;
  }
  CostParams link = path_only(p_);
  link.beta *= per_host_;
  const CostModel host(per_host_, path_only(within_)), lanes(hosts_, link);
  const size_t lane_bytes = bytes / static_cast<size_t>(per_host_);
  const Algorithm ring = Algorithm::kRing;
  // The phases within the host (collectives/algorithms/hier.cc, hier_ops.cc).
  // A root's scatter or gather of the buffer within its host moves the bytes
  // of the ring allgather in one round.
  double host_rounds = 0, host_seconds = 0;
  switch (kind) {
    case K::kAllreduce:
      host_rounds = host.rounds(K::kReduceScatter, ring) + host.rounds(K::kAllgather, ring);
      host_seconds =
          host.cost(K::kReduceScatter, ring, bytes) + host.cost(K::kAllgather, ring, bytes);
      break;
    case K::kReduceScatter:
      host_rounds = host.rounds(K::kReduceScatter, ring);
      host_seconds = host.cost(K::kReduceScatter, ring, bytes);
      break;
    case K::kAllgather:
      host_rounds = host.rounds(K::kAllgather, ring);
      host_seconds = host.cost(K::kAllgather, ring, bytes);
      break;
    case K::kBroadcast:  // scatter from the root, allgather
      host_rounds = 1 + host.rounds(K::kAllgather, ring);
      host_seconds = 2 * host.cost(K::kAllgather, ring, bytes);
      break;
    case K::kReduce:  // reduce-scatter, gather to the root
      host_rounds = host.rounds(K::kReduceScatter, ring) + 1;
      host_seconds =
          host.cost(K::kReduceScatter, ring, bytes) + host.cost(K::kAllgather, ring, bytes);
      break;
    case K::kBarrier:  // in, and out once the lane is through
      host_rounds = 2 * host.rounds(K::kBarrier, Algorithm::kDissemination);
      host_seconds = 2 * host.cost(K::kBarrier, Algorithm::kDissemination, 0);
      break;
    default:
      e.seconds = std::numeric_limits<double>::infinity();
      return e;
  }
  e.rounds = host_rounds + lanes.rounds(kind, between);
  e.seconds = host_seconds + lanes.cost(kind, between, lane_bytes);
  return e;
}

double CostModel::hierarchical(Algorithm between, size_t bytes) const {
  const Estimate e = hier_estimate(between, bytes);
  return p_.round * e.rounds + e.seconds;
}

std::string CostModel::to_string() const {
  if (!two_level()) return p_.to_string();
  return std::to_string(hosts_) + " hosts x " + std::to_string(per_host_) +
         " ranks; within a host " + within_.to_string() + "; between hosts " + p_.to_string();
}

std::vector<CostModel::Ranked> CostModel::ranked(CollectiveKind kind, size_t bytes) const {
  std::vector<Ranked> out;
  for (const AlgorithmInfo& info : algorithm_table()) {
    if (!info.implements(kind)) continue;
    const double c = cost(kind, info.id, bytes);
    if (std::isfinite(c)) out.push_back({info.id, c});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Ranked& x, const Ranked& y) { return x.seconds < y.seconds; });
  return out;
}

}  // namespace rdmaflow
