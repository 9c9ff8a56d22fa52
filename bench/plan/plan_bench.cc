// plan_bench: how long planning a large graph takes (docs/graph-plans.md).
//
// Builds a layered DAG of --ops ops (default 100,000), places it on --ranks
// ranks (default placement: contiguous blocks of the topological order), and
// times each planning phase, best of --repeat runs. The reference, measured in
// the same run, is parsing the same graph's JSON text: planning is reported as
// a ratio to the time it takes just to read the graph.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/partition.h"
#include "graph/placement.h"
#include "graph/plan_json.h"
#include "graph/synthetic.h"
#include "graph/validate.h"
#include "tools/cli.h"

namespace rg = rdmaflow::graph;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Best wall-clock and best CPU time of `repeat` runs (CPU time is what to read
// on a loaded machine: the planner is single-threaded).
struct Timing {
  double wall = 1e30;
  double cpu = 1e30;
};

Timing best_of(int repeat, const std::function<void()>& fn) {
  Timing best;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds();
    fn();
    double c1 = cpu_seconds();
    auto t1 = std::chrono::steady_clock::now();
    best.wall = std::min(best.wall, std::chrono::duration<double>(t1 - t0).count());
    best.cpu = std::min(best.cpu, c1 - c0);
  }
  return best;
}

[[noreturn]] void die(const rdmaflow::Status& st) {
  std::fprintf(stderr, "plan_bench: %s\n", st.to_string().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 100000, ranks = 8, width = 64, repeat = 3;
  bool json = false, random_placement = false;
  CLI::App app{
      "How long planning a large graph takes, as a ratio to parsing the same graph's JSON\n"
      "(docs/graph-plans.md, \"Planning time\").",
      "plan_bench"};
  rdmaflow::cli::configure(app);
  app.add_option("--ops", ops, "ops in the layered graph")->check(rdmaflow::cli::at_least(1));
  app.add_option("--ranks", ranks, "ranks to place it on")->check(rdmaflow::cli::at_least(1));
  app.add_option("--width", width, "ops per layer")->check(rdmaflow::cli::at_least(1));
  app.add_option("--repeat", repeat, "runs per phase; the best is reported")
      ->check(rdmaflow::cli::at_least(1));
  app.add_flag("--random-placement", random_placement,
               "every op on a random rank (most edges cross ranks) instead of contiguous blocks");
  app.add_flag("--json", json, "the timings as JSON");
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;

  const rg::Graph g = rg::synthetic::layered(ops, width);
  auto placement = rg::default_placement(g, ranks);
  if (!placement) die(placement.status());
  if (random_placement) {  // every op on a random rank: most edges cross ranks
    std::mt19937_64 rng(7);
    for (int& r : placement->rank) r = static_cast<int>(rng() % static_cast<uint64_t>(ranks));
  }
  const std::string graph_text = rg::write_graph_json(g, &*placement);

  // Reference: just reading the graph.
  Timing t_read = best_of(repeat, [&] {
    auto f = rg::parse_graph_json(graph_text);
    if (!f) die(f.status());
  });
  Timing t_validate = best_of(repeat, [&] {
    auto st = rg::validate(g);
    if (!st) die(st);
  });
  Timing t_place = best_of(repeat, [&] {
    auto p = rg::default_placement(g, ranks);
    if (!p) die(p.status());
  });
  Timing t_partition = best_of(repeat, [&] {
    auto pg = rg::partition(g, *placement, ranks);
    if (!pg) die(pg.status());
  });
  auto pg = rg::partition(g, *placement, ranks);
  if (!pg) die(pg.status());
  rg::TransferPlan plan;
  Timing t_analyze = best_of(repeat, [&] {
    auto p = rg::analyze(*pg, {});
    if (!p) die(p.status());
    plan = std::move(*p);
  });
  Timing t_total = best_of(repeat, [&] {
    auto p = rg::plan_transfers(g, *placement, ranks, {});
    if (!p) die(p.status());
  });
  std::string text;
  Timing t_write = best_of(repeat, [&] { text = rg::write_plan_json(plan); });
  uint64_t hash = rg::fnv1a64(text);

  uint64_t reg = 0, reg_noreuse = 0;
  for (const auto& r : plan.ranks) {
    reg += r.registered_bytes;
    reg_noreuse += r.registered_bytes_without_reuse;
  }
  const double saved = reg_noreuse ? 100.0 * (1.0 - double(reg) / double(reg_noreuse)) : 0.0;

  auto both = [](const Timing& t) {
    return nlohmann::ordered_json{{"wall", t.wall}, {"cpu", t.cpu}};
  };
  if (json) {
    nlohmann::ordered_json j;
    j["ops"] = g.num_ops();
    j["tensors"] = g.num_tensors();
    j["ranks"] = ranks;
    j["transfers"] = plan.transfers.size();
    j["placement"] = random_placement ? "random" : "default";
    j["seconds"] = {{"read_graph_json_reference", both(t_read)},
                    {"validate", both(t_validate)},
                    {"default_placement", both(t_place)},
                    {"partition", both(t_partition)},
                    {"analyze", both(t_analyze)},
                    {"plan_transfers_total", both(t_total)},
                    {"write_plan_json", both(t_write)}};
    j["plan_over_reference"] = t_total.cpu / t_read.cpu;
    j["plan_json_bytes"] = text.size();
    j["plan_hash"] = rg::hash_hex(hash);
    j["registered_bytes"] = reg;
    j["registered_bytes_without_reuse"] = reg_noreuse;
    j["reuse_saves_percent"] = saved;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "plan_bench: %zu ops, %zu tensors, %d ranks (%s placement) -> %zu transfers, "
      "best of %d\n",
      g.num_ops(), g.num_tensors(), ranks, random_placement ? "random" : "default",
      plan.transfers.size(), repeat);
  std::printf("  %-46s %9s %9s\n", "", "wall s", "cpu s");
  auto row = [](const std::string& what, const Timing& t) {
    std::printf("  %-46s %9.3f %9.3f\n", what.c_str(), t.wall, t.cpu);
  };
  char ref[96];
  std::snprintf(ref, sizeof ref, "reference: parse the graph JSON (%.1f MB)",
                double(graph_text.size()) / 1e6);
  row(ref, t_read);
  row("validate", t_validate);
  row("default placement", t_place);
  row("partition (validates too)", t_partition);
  row("analyze (schedule, liveness, memory)", t_analyze);
  row("plan_transfers = validate + partition + analyze", t_total);
  char wr[96];
  std::snprintf(wr, sizeof wr, "write plan JSON (%.1f MB) + hash", double(text.size()) / 1e6);
  row(wr, t_write);
  std::printf("  planning takes %.2fx the time to parse the graph (cpu)\n",
              t_total.cpu / t_read.cpu);
  std::printf("  registered memory: %.1f MiB with reuse, %.1f MiB without (saves %.1f%%)\n",
              double(reg) / (1 << 20), double(reg_noreuse) / (1 << 20), saved);
  std::printf("  plan hash %s\n", rg::hash_hex(hash).c_str());
  return 0;
}
