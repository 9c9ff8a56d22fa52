// rdmaflow_cost_model: what the collectives' alpha-beta-gamma cost model
// (collectives/cost_model.h) predicts for a layout of hosts x ranks per host,
// given the costs of each level. docs/scaling.md compares its predictions with
// allreduce times measured on the cluster and projects them to 1024 ranks.
//
//   rdmaflow_cost_model --hosts 8 --alpha 12e-6 --beta 0.85e-9 --gamma 0.03e-9
//       --sizes 8,64K,1M,16M                      one rank per host: every algorithm
//   rdmaflow_cost_model --hosts 128 --per-host 8 --alpha 12e-6 --beta 0.32e-9
//       --gamma 0.03e-9 --intra-alpha 1e-6 --intra-beta 0.1e-9 --sizes 1M,64M,256M
//
// One rank per host: each algorithm that implements --op, costed by the
// library's own model (the one that picks algorithms at run time) with the
// between-host alpha and beta.
//
// Several ranks per host (allreduce): the two-level schedules below, each
// costed per step with the costs of the level the step runs on. Ranks are
// numbered host by host; the q ranks of a host share its link, so a step in
// which all of them send across hosts at once moves q times the bytes over it.
//   flat ring          one ring over all n = hosts x q ranks: each of its 2(n-1)
//                      steps waits for its one hop between hosts
//   flat rabenseifner  recursive halving then doubling over all n ranks, far
//                      partners first (as implemented): the steps at distance
//                      >= q cross hosts, q ranks at once, the first with half
//                      the buffer each
//   flat rabenseifner near
//                      the same with the near partners first: the host's
//                      ranks reduce among themselves before anything crosses
//   hier ring / hier rabenseifner
//                      the library's hier (collectives/algorithms/hier.cc,
//                      CostModel::hierarchical) with ring or Rabenseifner
//                      between hosts: reduce-scatter within the host (ring),
//                      allreduce of the host's 1/q share between hosts by q
//                      lanes at once, allgather within the host (ring)
// Before those, every algorithm as the library's model (the selector) costs it.
// The bound is the link's: every host sends 2(H-1)/H of the buffer at least.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithms/registry.h"
#include "collectives/cost_model.h"
#include "tools/cli.h"

using namespace rdmaflow;

namespace {

struct Args {
  std::string op = "allreduce";
  int hosts = 2;
  int per_host = 1;
  double alpha = 0, beta = 0, gamma = 0;  // between hosts (and the reduction)
  double gamma_cold = 0;                  // out of cache (0: gamma at every size)
  size_t cache = 1 << 20;
  double intra_alpha = 0, intra_beta = 0;
  double round = 0;
  int cpus = 0;
  size_t piece = 512 * 1024;
  std::vector<size_t> sizes;
  bool json = false;
  bool terms = false;
};

struct Row {
  size_t bytes;
  std::string schedule;
  double seconds;
};

CostParams level(const Args& a, double alpha, double beta) {
  CostParams p;
  p.alpha = alpha;
  p.beta = beta;
  p.gamma = a.gamma;
  p.gamma_cold = a.gamma_cold;
  p.cache_bytes = a.cache;
  p.round = a.round;
  p.cpus = a.cpus;
  p.piece_bytes = a.piece;
  return p;
}

// Recursive halving then doubling over n = hosts x q ranks, step by step:
// with the far partners first (as collectives/algorithms/rabenseifner.cc
// does) or the near ones first.
double flat_rabenseifner(const Args& a, double m, bool near_first) {
  const int n = a.hosts * a.per_host;
  const CostModel inter(n, level(a, a.alpha, a.beta));
  const CostTerms t = inter.terms(static_cast<size_t>(m));
  double total = t.pieces(m / 2) * a.alpha;
  double bytes = m;
  for (int k = 1; (1 << k) <= n; ++k) {
    const int distance = near_first ? 1 << (k - 1) : n >> k;
    bytes /= 2;
    const bool across = distance >= a.per_host;
    const double step =
        across ? a.alpha + a.per_host * bytes * a.beta : a.intra_alpha + bytes * a.intra_beta;
    total += 2 * step + bytes * a.gamma;  // halving reduces; doubling does not
  }
  return total;
}

std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "What the collectives' cost model predicts for hosts x ranks per host, given the costs\n"
      "of each level (seconds per message, seconds per byte). docs/scaling.md.",
      "rdmaflow_cost_model"};
  cli::configure(app);
  app.add_option("--op", a.op, "the collective (one rank per host: any; several: allreduce)")
      ->check(CLI::IsMember(
          {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"}));
  app.add_option("--hosts", a.hosts, "hosts")->check(CLI::Range(1, 1 << 20));
  app.add_option("--per-host", a.per_host, "ranks per host (a power of two above 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--alpha", a.alpha, "s per message between hosts")->required();
  app.add_option("--beta", a.beta, "s per byte between hosts (1 / link bytes per s)")->required();
  app.add_option("--gamma", a.gamma, "s per byte reduced")->required();
  app.add_option(
      "--gamma-cold", a.gamma_cold,
      "s per byte reduced out of cache (CostParams::gamma_at); 0: --gamma at every size");
  cli::add_size(app, "--cache", a.cache, "the cache reductions run in (RDMAFLOW_COLL_CACHE_BYTES)");
  app.add_option("--intra-alpha", a.intra_alpha, "s per message within a host (--per-host > 1)");
  app.add_option("--intra-beta", a.intra_beta, "s per byte within a host (--per-host > 1)");
  app.add_option("--round", a.round, "s per dependent round beyond alpha (cost_model.h)");
  app.add_option("--cpus", a.cpus,
                 "crowded ranks: the CPUs every rank's sends share (cost_model.h); 0: not crowded")
      ->check(cli::at_least(0));
  cli::add_size(app, "--piece", a.piece, "pipeline piece bytes (RDMAFLOW_COLL_SLOT_BYTES)");
  cli::add_sizes(app, "--sizes", a.sizes, "buffer sizes (bytes of the largest buffer)")->required();
  app.add_flag("--json", a.json, "print JSON instead of a table");
  app.add_flag("--terms", a.terms,
               "with --cpus and --per-host > 1, not --json: each algorithm's crowded estimate term "
               "by term (CostModel::crowded)");
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  const bool two_level = a.per_host > 1;
  if (two_level && (a.op != "allreduce" || (a.per_host & (a.per_host - 1)) != 0 ||
                    (a.hosts & (a.hosts - 1)) != 0)) {
    std::fprintf(stderr,
                 "rdmaflow_cost_model: --per-host > 1 models allreduce with powers of two of "
                 "hosts and ranks per host\n");
    return cli::kUsageError;
  }
  if (two_level && (a.intra_alpha <= 0 || a.intra_beta <= 0)) {
    std::fprintf(stderr,
                 "rdmaflow_cost_model: --per-host > 1 needs --intra-alpha and --intra-beta\n");
    return cli::kUsageError;
  }
  return std::nullopt;
}

}  // namespace

// The crowded estimate of every algorithm, term by term: what tells two apart.
void print_terms(const CostModel& model, CollectiveKind kind, size_t bytes) {
  std::printf(
      "# %zu B: seconds (us) = rounds + messages + bytes + memory + excess + chain + path\n",
      bytes);
  const CostTerms t = model.work_terms(bytes);
  for (Algorithm algo : algorithms_for(kind)) {
    const AlgorithmInfo* info = find_algorithm(algo);
    const double total = model.cost(kind, algo, bytes);
    if (info == nullptr || info->work == nullptr || !std::isfinite(total)) continue;
    const CostModel::CrowdedTerms c = model.crowded_terms(info->work(kind, t), t.g);
    const double rounds = model.params().round * model.rounds(kind, algo), us = 1e6;
    std::printf("%-14s %9.1f = %6.1f + %8.1f + %8.1f + %8.1f + %8.1f + %8.1f + %8.1f\n",
                std::string(algorithm_name(algo)).c_str(), total * us, rounds * us, c.messages * us,
                c.bytes * us, c.memory * us, c.excess * us, c.chain * us,
                (total - rounds - c.total()) * us);
  }
}

int main(int argc, char** argv) {
  Args a;
  if (auto exit_code = parse(argc, argv, a)) return *exit_code;
  const int n = a.hosts * a.per_host;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  for (CollectiveKind k : kAllCollectives) {
    if (collective_name(k) == a.op) kind = k;
  }
  std::vector<Row> rows;
  for (size_t bytes : a.sizes) {
    const double m = static_cast<double>(bytes);
    if (a.per_host == 1) {
      const CostModel model(n, level(a, a.alpha, a.beta));
      for (Algorithm algo : algorithms_for(kind)) {
        const double seconds = model.cost(kind, algo, bytes);
        // hier needs two levels
        if (std::isfinite(seconds))
          rows.push_back({bytes, std::string(algorithm_name(algo)), seconds});
      }
      continue;
    }
    const CostModel two(a.hosts, a.per_host, level(a, a.intra_alpha, a.intra_beta),
                        level(a, a.alpha, a.beta));
    if (a.terms && !a.json && two.crowded()) print_terms(two, kind, bytes);
    // What the selector weighs: every algorithm by the library's model.
    for (Algorithm algo : algorithms_for(kind)) {
      const double seconds = two.cost(kind, algo, bytes);
      if (std::isfinite(seconds))
        rows.push_back({bytes, std::string(algorithm_name(algo)), seconds});
    }
    rows.push_back({bytes, "flat ring", two.cost(kind, Algorithm::kRing, bytes)});
    rows.push_back({bytes, "flat rabenseifner", flat_rabenseifner(a, m, false)});
    rows.push_back({bytes, "flat rabenseifner near", flat_rabenseifner(a, m, true)});
    rows.push_back({bytes, "hier ring", two.hierarchical(Algorithm::kRing, bytes)});
    rows.push_back({bytes, "hier rabenseifner", two.hierarchical(Algorithm::kRabenseifner, bytes)});
  }
  // The link's bound: each host sends 2(H-1)/H of the buffer (allreduce).
  auto bound = [&](double m) {
    return kind == CollectiveKind::kAllreduce && a.hosts > 1
               ? 2.0 * (a.hosts - 1) / a.hosts * m * a.beta
               : 0.0;
  };
  auto busbw = [&](double m, double s) { return s > 0 ? m / s * 2.0 * (n - 1) / n / 1e9 : 0.0; };
  if (a.json) {
    nlohmann::json out = {{"op", a.op},
                          {"hosts", a.hosts},
                          {"per_host", a.per_host},
                          {"ranks", n},
                          {"alpha", a.alpha},
                          {"beta", a.beta},
                          {"gamma", a.gamma},
                          {"gamma_cold", a.gamma_cold},
                          {"cache", a.cache},
                          {"intra_alpha", a.intra_alpha},
                          {"intra_beta", a.intra_beta},
                          {"round", a.round},
                          {"cpus", a.cpus},
                          {"piece", a.piece},
                          {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      const double m = static_cast<double>(r.bytes);
      out["rows"].push_back({{"size", r.bytes},
                             {"schedule", r.schedule},
                             {"seconds", std::isfinite(r.seconds) ? r.seconds : -1.0},
                             {"bound_seconds", bound(m)},
                             {"busbw_gbs", busbw(m, r.seconds)}});
    }
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  std::printf("# %s, %d hosts x %d ranks; between hosts alpha %.2f us, beta %.3f ns/B (%.2f GB/s);",
              a.op.c_str(), a.hosts, a.per_host, a.alpha * 1e6, a.beta * 1e9,
              a.beta > 0 ? 1e-9 / a.beta : 0.0);
  if (a.per_host > 1) {
    std::printf(" within alpha %.2f us, beta %.3f ns/B;", a.intra_alpha * 1e6, a.intra_beta * 1e9);
  }
  std::printf(" gamma %.3f ns/B\n", a.gamma * 1e9);
  std::printf("%12s  %-22s %12s %10s %12s %8s\n", "size(B)", "schedule", "time(us)", "busbw",
              "bound(us)", "of bound");
  for (const Row& r : rows) {
    const double m = static_cast<double>(r.bytes), b = bound(m);
    std::printf("%12zu  %-22s %12.1f %10.3f %12.1f %7.0f%%\n", r.bytes, r.schedule.c_str(),
                r.seconds * 1e6, busbw(m, r.seconds), b * 1e6,
                b > 0 && std::isfinite(r.seconds) ? 100.0 * b / r.seconds : 0.0);
  }
  return 0;
}
