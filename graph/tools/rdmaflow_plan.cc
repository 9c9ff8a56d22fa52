// rdmaflow-plan: plans a model's cross-rank transfers and prints, per rank
// (pipeline stage), the ops and their estimated compute, the transfers in and
// out, bytes per step, static and dynamic counts, and the registered memory
// with and without reuse (docs/graph-plans.md). Reads rdmaflow JSON graphs and
// ONNX models (chosen by content); without a placement it cuts the model into
// pipeline stages (graph/pipeline.h); --train adds the backward pass.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "graph/analyze.h"
#include "graph/cost.h"
#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/json_util.h"
#include "graph/partition.h"
#include "graph/pipeline.h"
#include "graph/plan_json.h"
#include "graph/tools/load_model.h"
#include "graph/training.h"
#include "tools/cli.h"

namespace rg = rdmaflow::graph;

namespace {

std::string human_bytes(uint64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string percent_saved(uint64_t with, uint64_t without) {
  if (!without) return "0.0%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                100.0 * (1.0 - static_cast<double>(with) / static_cast<double>(without)));
  return buf;
}

// What the summaries print beside the plan.
struct Context {
  std::string model;      // format and what the loader found
  std::string placement;  // where the placement came from
  bool train = false;
  std::vector<double> rank_flops;  // estimated compute per rank (graph/cost.h)
  const rg::PipelinePartition* pipeline = nullptr;
};

std::string flops(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GFLOP", f / 1e9);
  return buf;
}

std::string transfer_line(const rg::TransferSpec& t, bool out) {
  char buf[512];
  std::string type = std::string(rdmaflow::dtype_name(t.dtype)) + rg::shape_to_string(t.shape);
  std::snprintf(buf, sizeof buf, "    %s #%-5u %-28s %-22s %12s %s rank %-3d %s\n",
                out ? "out" : "in ", t.id, t.tensor.c_str(), type.c_str(),
                human_bytes(t.bytes).c_str(), out ? "->" : "<-", out ? t.dst_rank : t.src_rank,
                t.dynamic ? "dynamic (hint)" : "static");
  return buf;
}

void print_text(const rg::Graph& g, const Context& c, const rg::TransferPlan& p, uint64_t hash,
                size_t list) {
  uint32_t nstatic = 0, ndynamic = 0;
  uint64_t step_bytes = 0, reg = 0, reg_noreuse = 0;
  for (const auto& t : p.transfers) {
    (t.dynamic ? ndynamic : nstatic)++;
    step_bytes += t.bytes;
  }
  for (const auto& r : p.ranks) {
    reg += r.registered_bytes;
    reg_noreuse += r.registered_bytes_without_reuse;
  }
  double total_flops = 0;
  for (double f : c.rank_flops) total_flops += f;
  std::printf("model: %s\n", c.model.c_str());
  std::printf("graph '%s'%s: %zu ops, %zu tensors on %d ranks (placement: %s)\n", g.name.c_str(),
              c.train ? " (training: forward and backward)" : "", g.num_ops(), g.num_tensors(),
              p.num_ranks, c.placement.c_str());
  if (c.pipeline) {
    std::printf("pipeline: %d stages, estimated compute %s;", p.num_ranks,
                flops(total_flops).c_str());
    for (size_t k = 0; k < c.pipeline->cut_bytes.size(); ++k) {
      std::printf(" cut %zu|%zu: %s forward", k, k + 1,
                  human_bytes(c.pipeline->cut_bytes[k]).c_str());
      std::printf(k + 1 < c.pipeline->cut_bytes.size() ? "," : "");
    }
    std::printf("\n");
    if (!c.pipeline->shared_weights.empty()) {
      std::printf("  %zu weights are read on more than one stage (sent every step):",
                  c.pipeline->shared_weights.size());
      for (size_t i = 0; i < c.pipeline->shared_weights.size() && i < list; ++i) {
        std::printf(" %s", g.tensor(c.pipeline->shared_weights[i]).name.c_str());
      }
      std::printf("\n");
    }
  }
  std::printf(
      "plan %s (graph %s): %zu transfers, %u static, %u dynamic; depth %u, alignment %llu\n",
      rg::hash_hex(hash).c_str(), rg::hash_hex(p.graph_hash).c_str(), p.transfers.size(), nstatic,
      ndynamic, p.options.pipeline_depth, static_cast<unsigned long long>(p.options.alignment));
  for (const auto& r : p.ranks) {
    const double f = c.rank_flops[static_cast<size_t>(r.rank)];
    std::printf("\nrank %d: %zu ops scheduled, estimated compute %s (%.1f%%)\n", r.rank,
                r.schedule.size(), flops(f).c_str(), total_flops > 0 ? 100 * f / total_flops : 0.0);
    std::printf("  out: %zu transfers (%u static, %u dynamic), %s per step\n", r.sends.size(),
                r.static_out, r.dynamic_out, human_bytes(r.bytes_out_per_step).c_str());
    for (size_t i = 0; i < r.sends.size() && i < list; ++i) {
      std::fputs(transfer_line(p.transfers[r.sends[i]], true).c_str(), stdout);
    }
    if (r.sends.size() > list) std::printf("    ... and %zu more\n", r.sends.size() - list);
    std::printf("  in:  %zu transfers (%u static, %u dynamic), %s per step\n", r.recvs.size(),
                r.static_in, r.dynamic_in, human_bytes(r.bytes_in_per_step).c_str());
    for (size_t i = 0; i < r.recvs.size() && i < list; ++i) {
      std::fputs(transfer_line(p.transfers[r.recvs[i]], false).c_str(), stdout);
    }
    if (r.recvs.size() > list) std::printf("    ... and %zu more\n", r.recvs.size() - list);
    std::printf("  registered memory: %s with reuse, %s without (%u x %s frames; saves %s)\n",
                human_bytes(r.registered_bytes).c_str(),
                human_bytes(r.registered_bytes_without_reuse).c_str(), r.copies,
                human_bytes(r.frame_bytes).c_str(),
                percent_saved(r.registered_bytes, r.registered_bytes_without_reuse).c_str());
  }
  std::printf(
      "\ntotal: %zu transfers (%u static, %u dynamic), %s per step; registered memory %s "
      "with reuse, %s without (saves %s)\n",
      p.transfers.size(), nstatic, ndynamic, human_bytes(step_bytes).c_str(),
      human_bytes(reg).c_str(), human_bytes(reg_noreuse).c_str(),
      percent_saved(reg, reg_noreuse).c_str());
}

void print_json(const rg::Graph& g, const Context& c, const rg::TransferPlan& p, uint64_t hash) {
  nlohmann::ordered_json j;
  j["model"] = c.model;
  j["graph"] = g.name;
  j["train"] = c.train;
  j["ops"] = g.num_ops();
  j["tensors"] = g.num_tensors();
  j["num_ranks"] = p.num_ranks;
  j["placement"] = c.placement;
  if (c.pipeline) {
    nlohmann::ordered_json pj;
    pj["stages"] = p.num_ranks;
    pj["cut_bytes"] = c.pipeline->cut_bytes;
    pj["shared_weights"] = nlohmann::ordered_json::array();
    for (rg::TensorId t : c.pipeline->shared_weights)
      pj["shared_weights"].push_back(g.tensor(t).name);
    j["pipeline"] = std::move(pj);
  }
  j["plan_hash"] = rg::hash_hex(hash);
  j["graph_hash"] = rg::hash_hex(p.graph_hash);
  j["pipeline_depth"] = p.options.pipeline_depth;
  j["alignment"] = p.options.alignment;
  uint64_t step_bytes = 0, reg = 0, reg_noreuse = 0;
  uint32_t nstatic = 0, ndynamic = 0;
  j["transfers"] = nlohmann::ordered_json::array();
  for (const auto& t : p.transfers) {
    nlohmann::ordered_json tj;
    tj["id"] = t.id;
    tj["tensor"] = t.tensor;
    tj["src"] = t.src_rank;
    tj["dst"] = t.dst_rank;
    tj["bytes"] = t.bytes;
    tj["dynamic"] = t.dynamic;
    j["transfers"].push_back(std::move(tj));
    (t.dynamic ? ndynamic : nstatic)++;
    step_bytes += t.bytes;
  }
  j["ranks"] = nlohmann::ordered_json::array();
  for (const auto& r : p.ranks) {
    nlohmann::ordered_json rj;
    rj["rank"] = r.rank;
    rj["ops"] = r.schedule.size();
    rj["estimated_flops"] = c.rank_flops[static_cast<size_t>(r.rank)];
    rj["transfers_out"] = r.sends;
    rj["transfers_in"] = r.recvs;
    rj["bytes_out_per_step"] = r.bytes_out_per_step;
    rj["bytes_in_per_step"] = r.bytes_in_per_step;
    rj["static_out"] = r.static_out;
    rj["dynamic_out"] = r.dynamic_out;
    rj["static_in"] = r.static_in;
    rj["dynamic_in"] = r.dynamic_in;
    rj["frame_bytes"] = r.frame_bytes;
    rj["copies"] = r.copies;
    rj["registered_bytes"] = r.registered_bytes;
    rj["registered_bytes_without_reuse"] = r.registered_bytes_without_reuse;
    reg += r.registered_bytes;
    reg_noreuse += r.registered_bytes_without_reuse;
    j["ranks"].push_back(std::move(rj));
  }
  nlohmann::ordered_json tot;
  tot["transfers"] = p.transfers.size();
  tot["static"] = nstatic;
  tot["dynamic"] = ndynamic;
  tot["bytes_per_step"] = step_bytes;
  tot["registered_bytes"] = reg;
  tot["registered_bytes_without_reuse"] = reg_noreuse;
  j["total"] = std::move(tot);
  std::printf("%s\n",
              j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out.flush());
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, placement_path, plan_out, placement_out;
  int ranks = 0;
  bool json = false;
  size_t list = 32;
  rg::PlanOptions options;
  CLI::App app{
      "Plans every cross-rank transfer of MODEL (an rdmaflow JSON graph or an ONNX model)\n"
      "and prints, per rank, the ops and their estimated compute, the transfers in and\n"
      "out, the bytes moved per step, static and dynamic counts, and the registered\n"
      "memory with and without reuse.",
      "rdmaflow-plan"};
  rdmaflow::cli::configure(app);
  app.add_option("graph", graph_path,
                 "the model: an rdmaflow JSON graph or an ONNX model, told apart by content\n"
                 "(docs/graph-format.md)")
      ->type_name("MODEL")
      ->required();
  std::vector<std::string> dim_args;
  app.add_option("--dim", dim_args,
                 "NAME=VALUE: a size for an ONNX model's symbolic dimension (repeatable);\n"
                 "dynamic tensors get their size with it as a size hint")
      ->type_name("NAME=VALUE");
  app.add_option("--ranks", ranks, "number of ranks; required when the graph has no placement")
      ->check(CLI::Range(1, rg::kMaxRanks))
      ->default_str("1 + the placement's highest rank");
  app.add_option("--placement", placement_path,
                 "placement document (default: the graph's own, else --partition)")
      ->type_name("FILE");
  std::string partition_mode = "pipeline";
  app.add_option("--partition", partition_mode,
                 "without a placement: 'pipeline' (N stages balancing estimated compute,\n"
                 "cut where the fewest bytes cross, weights with their readers) or 'blocks'\n"
                 "(N blocks of equal op count of the topological order)")
      ->check(CLI::IsMember({"pipeline", "blocks"}))
      ->capture_default_str();
  rg::PipelineOptions pipeline_options;
  app.add_option("--tolerance", pipeline_options.tolerance,
                 "pipeline: how far (a fraction of one stage's compute) a cut may move\n"
                 "from the balanced point to cross fewer bytes")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  bool train = false;
  app.add_flag("--train", train,
               "plan a training step: the backward pass too, one gradient transfer back for\n"
               "every activation sent forward");
  app.add_flag("--json", json, "machine-readable summary on stdout");
  app.add_option("--depth", options.pipeline_depth, "slots per transfer / registered frames")
      ->check(CLI::Range(1, 64));
  rdmaflow::cli::add_size(app, "--alignment", options.alignment, "alignment of every buffer");
  rdmaflow::cli::add_size(app, "--dynamic-hint", options.dynamic_size_hint,
                          "payload reserved for dynamic tensors without size_hint");
  bool no_reuse = false;
  app.add_flag("--no-reuse", no_reuse, "give every buffer its own bytes");
  app.add_option("--list", list, "list at most N transfers per rank and direction");
  app.add_option("--write-plan", plan_out, "write the full plan (JSON) to FILE")->type_name("FILE");
  app.add_option("--write-placement", placement_out, "write the placement used to FILE")
      ->type_name("FILE");
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  options.reuse = !no_reuse;
  auto usage_error = [&](const std::string& msg) {
    std::fprintf(stderr, "rdmaflow-plan: %s\n\n%s", msg.c_str(), app.help().c_str());
    return rdmaflow::cli::kUsageError;
  };

  std::map<std::string, int64_t> dims;
  for (const auto& d : dim_args) {
    if (auto st = rg::parse_dim_binding(d, dims); !st) return usage_error(st.reason());
  }
  auto model = rg::load_model(graph_path, dims);
  if (!model) {
    std::fprintf(stderr, "rdmaflow-plan: %s\n", model.status().to_string().c_str());
    return 1;
  }
  const rg::GraphFile* file = &model->file;
  Context ctx;
  ctx.model = graph_path + ": " + model->description;
  ctx.train = train;
  const rg::Graph& forward = file->graph;
  rg::Placement placement;
  if (!placement_path.empty()) {
    auto p = rg::load_placement_file(placement_path, forward);
    if (!p) {
      std::fprintf(stderr, "rdmaflow-plan: %s\n", p.status().to_string().c_str());
      return 1;
    }
    placement = std::move(*p);
    ctx.placement = placement_path;
  } else if (!file->placement.empty()) {
    placement = file->placement;
    ctx.placement = "from the graph file";
  }
  if (ranks == 0) {
    if (placement.empty()) return usage_error("--ranks is required when no placement is given");
    for (int r : placement.rank) ranks = std::max(ranks, r + 1);
  }
  std::optional<rg::PipelinePartition> pipeline;
  if (placement.empty() && partition_mode == "pipeline") {
    pipeline_options.dynamic_hint = options.dynamic_size_hint;
    auto p = rg::pipeline_partition(forward, ranks, pipeline_options);
    if (!p) {
      std::fprintf(stderr, "rdmaflow-plan: %s\n", p.status().to_string().c_str());
      return 1;
    }
    pipeline = std::move(*p);
    placement = pipeline->placement;
    ctx.pipeline = &*pipeline;
    ctx.placement = "default: pipeline stages balancing estimated compute";
  } else if (placement.empty()) {
    auto p = rg::default_placement(forward, ranks);
    if (!p) {
      std::fprintf(stderr, "rdmaflow-plan: %s\n", p.status().to_string().c_str());
      return 1;
    }
    placement = std::move(*p);
    ctx.placement = "default: contiguous blocks of the topological order";
  }
  std::optional<rg::TrainingGraph> training;
  if (train) {
    auto t = rg::add_backward(forward, placement, options.dynamic_size_hint);
    if (!t) {
      std::fprintf(stderr, "rdmaflow-plan: %s\n", t.status().to_string().c_str());
      return 1;
    }
    training = std::move(*t);
    placement = training->placement;
  }
  const rg::Graph& g = training ? training->graph : forward;
  auto plan = rg::plan_transfers(g, placement, ranks, options);
  if (!plan) {
    std::fprintf(stderr, "rdmaflow-plan: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  ctx.rank_flops.assign(static_cast<size_t>(ranks), 0.0);
  const std::vector<double> costs = rg::estimate_costs(g, options.dynamic_size_hint);
  for (size_t i = 0; i < g.num_ops(); ++i) {
    ctx.rank_flops[static_cast<size_t>(placement.rank[i])] += costs[i];
  }
  std::string text = rg::write_plan_json(*plan);
  uint64_t hash = rg::fnv1a64(text);
  if (!plan_out.empty() && !write_file(plan_out, text)) {
    std::fprintf(stderr, "rdmaflow-plan: cannot write %s\n", plan_out.c_str());
    return 1;
  }
  if (!placement_out.empty() &&
      !write_file(placement_out, rg::write_placement_json(g, placement))) {
    std::fprintf(stderr, "rdmaflow-plan: cannot write %s\n", placement_out.c_str());
    return 1;
  }
  if (json) {
    print_json(g, ctx, *plan, hash);
  } else {
    print_text(g, ctx, *plan, hash, list);
  }
  return 0;
}
