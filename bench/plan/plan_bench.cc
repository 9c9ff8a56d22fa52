// plan_bench: how long planning a large graph takes (docs/graph-plans.md).
//
// Builds a layered DAG of --ops ops (default 100,000), places it on --ranks
// ranks (default placement: contiguous blocks of the topological order), and
// times each planning phase, best of --repeat runs. The reference, measured in
// the same run, is parsing the same graph's JSON text: planning is reported as
// a ratio to the time it takes just to read the graph.
//
// With --model FILE (an ONNX model or a JSON graph, e.g. one torch exported)
// it times what rdmaflow-plan does with it instead: load (for ONNX: protobuf,
// ONNX shape inference, conversion), cut into --ranks pipeline stages, add the
// backward pass (--train), plan; the reference is loading the model.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/model_format.h"
#include "graph/partition.h"
#include "graph/pipeline.h"
#include "graph/placement.h"
#include "graph/plan_json.h"
#include "graph/synthetic.h"
#include "graph/tools/load_model.h"
#include "graph/training.h"
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

// --model: load, pipeline partition, (backward pass,) plan, each timed.
int bench_model(const std::string& path, const std::map<std::string, int64_t>& dims, int ranks,
                bool train, int repeat, bool json) {
  rg::LoadedModel model;
  Timing t_load = best_of(repeat, [&] {
    auto m = rg::load_model(path, dims);
    if (!m) die(m.status());
    model = std::move(*m);
  });
  const rg::Graph& g = model.file.graph;
  rg::PipelinePartition pipeline;
  Timing t_partition = best_of(repeat, [&] {
    auto p = rg::pipeline_partition(g, ranks);
    if (!p) die(p.status());
    pipeline = std::move(*p);
  });
  rg::TrainingGraph training;
  Timing t_backward;
  if (train) {
    t_backward = best_of(repeat, [&] {
      auto t = rg::add_backward(g, pipeline.placement, rg::PlanOptions{}.dynamic_size_hint);
      if (!t) die(t.status());
      training = std::move(*t);
    });
  }
  const rg::Graph& planned = train ? training.graph : g;
  const rg::Placement& placement = train ? training.placement : pipeline.placement;
  rg::TransferPlan plan;
  Timing t_plan = best_of(repeat, [&] {
    auto p = rg::plan_transfers(planned, placement, ranks, {});
    if (!p) die(p.status());
    plan = std::move(*p);
  });
  // What rdmaflow-plan does after loading, in one go.
  Timing t_total = best_of(repeat, [&] {
    auto p = rg::pipeline_partition(g, ranks);
    if (!p) die(p.status());
    rg::Placement pl = p->placement;
    std::optional<rg::TrainingGraph> t;
    if (train) {
      auto tr = rg::add_backward(g, pl, rg::PlanOptions{}.dynamic_size_hint);
      if (!tr) die(tr.status());
      t = std::move(*tr);
    }
    auto plan2 = rg::plan_transfers(t ? t->graph : g, t ? t->placement : pl, ranks, {});
    if (!plan2) die(plan2.status());
  });
  if (json) {
    auto both = [](const Timing& t) {
      return nlohmann::ordered_json{{"wall", t.wall}, {"cpu", t.cpu}};
    };
    nlohmann::ordered_json j;
    j["model"] = path;
    j["format"] = rg::model_format_name(model.format);
    j["ops"] = g.num_ops();
    j["planned_ops"] = planned.num_ops();
    j["ranks"] = ranks;
    j["train"] = train;
    j["transfers"] = plan.transfers.size();
    j["seconds"] = {{"load_model_reference", both(t_load)},
                    {"pipeline_partition", both(t_partition)},
                    {"add_backward", both(t_backward)},
                    {"plan_transfers", both(t_plan)},
                    {"partition_and_plan_total", both(t_total)}};
    j["plan_over_load"] = t_total.cpu / t_load.cpu;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "plan_bench: %s (%s): %zu ops%s, %d pipeline stages -> %zu transfers, best of %d\n",
      path.c_str(), model.description.c_str(), g.num_ops(),
      train ? (" (" + std::to_string(planned.num_ops()) + " with the backward pass)").c_str() : "",
      ranks, plan.transfers.size(), repeat);
  std::printf("  %-46s %9s %9s\n", "", "wall s", "cpu s");
  auto row = [](const std::string& what, const Timing& t) {
    std::printf("  %-46s %9.4f %9.4f\n", what.c_str(), t.wall, t.cpu);
  };
  row("reference: load the model", t_load);
  row("pipeline partition", t_partition);
  if (train) row("add the backward pass", t_backward);
  row("plan_transfers (validate, partition, analyze)", t_plan);
  row("partition + plan, as rdmaflow-plan does", t_total);
  std::printf("  partition + plan take %.2fx the time to load the model (cpu)\n",
              t_total.cpu / t_load.cpu);
  return 0;
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
  std::string model_path;
  app.add_option("--model", model_path,
                 "time planning this model (ONNX or JSON) as pipeline stages instead")
      ->type_name("FILE");
  std::vector<std::string> dim_args;
  app.add_option("--dim", dim_args, "with --model: a symbolic dimension's size (repeatable)")
      ->type_name("NAME=VALUE");
  bool train = false;
  app.add_flag("--train", train, "with --model: plan the backward pass too");
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  if (!model_path.empty()) {
    std::map<std::string, int64_t> dims;
    for (const auto& d : dim_args) {
      if (auto st = rg::parse_dim_binding(d, dims); !st) die(st);
    }
    return bench_model(model_path, dims, ranks, train, repeat, json);
  }

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
