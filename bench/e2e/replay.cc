// rdmaflow-replay: runs a model's planned transfers step after step across
// real processes, on each transport and on the gRPC baseline, and prints the
// step time of each beside the link-bound lower bound (docs/graph-plans.md,
// "Replaying a plan").
//
//   rdmaflow-replay MODEL --ranks N [--dim batch=8 ...] [--train] [--steps S]
//                   [--transports tcp,ucx,grpc] [--vary] [--gflops G] [--json FILE]
//                   [--hosts h0:1,h1:1,... --rsh-agent "scripts/cluster rsh"]
//
// Every transport gets its own job of N processes (bench/e2e/launch.h), on
// this host or, with --hosts, on the hosts through mpirun (by slot, as e2e
// places them), each rank the model's pipeline stage (graph/pipeline.h): the
// Sends write a pattern, the Recvs check every byte of it on arrival
// (bench/e2e/replay_job.h). gRPC runs with the malloc tunables its docs ask
// for (docs/grpc-baseline.md). The bound is the bytes the busiest rank moves
// in one direction per step over the link rate measured in the same run:
// between two processes of this host (plain TCP sockets over loopback), or
// with --hosts between the first two hosts (exact with one rank per host;
// ranks sharing a host move some bytes through memory instead).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench/e2e/host_options.h"
#include "bench/e2e/job.h"
#include "bench/e2e/launch.h"
#include "graph/model_format.h"
#include "tools/cli.h"
#include "transport/transport.h"

namespace {

using json = nlohmann::json;
namespace e2e = rdmaflow::e2e;

// The bytes the busiest rank sends or receives per step.
uint64_t busiest_rank_bytes(const json& result) {
  uint64_t busiest = 0;
  const double steps = std::max(1, result.value("steps", 1));
  for (const auto& r : result["ranks"]) {
    busiest = std::max(busiest, static_cast<uint64_t>(r["bytes_sent"].get<double>() / steps));
    busiest = std::max(busiest, static_cast<uint64_t>(r["bytes_verified"].get<double>() / steps));
  }
  return busiest;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--e2e-worker") == 0) return e2e::worker_main();
  std::string model, json_out;
  int ranks = 2, steps = 10;
  bool train = false, vary = false;
  double gflops = 0;
  uint32_t depth = 2;
  std::vector<std::string> dim_args, transports;
  CLI::App app{
      "Replays MODEL's planned transfers (ONNX or JSON, cut into --ranks pipeline stages) step\n"
      "after step across --ranks processes of this host, on each transport and on gRPC,\n"
      "checking every byte on arrival, and prints each one's step time beside the\n"
      "link-bound lower bound.",
      "rdmaflow-replay"};
  rdmaflow::cli::configure(app);
  app.add_option("model", model, "the model (docs/graph-format.md)")
      ->type_name("MODEL")
      ->required();
  app.add_option("--ranks", ranks, "processes = pipeline stages")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--dim", dim_args, "NAME=VALUE: a symbolic dimension's size (repeatable)")
      ->type_name("NAME=VALUE");
  app.add_flag("--train", train, "replay a training step: gradients flow back too");
  app.add_option("--steps", steps, "steps per transport (the first 3 are warm-up)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--depth", depth, "pipeline depth (frames)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--vary", vary,
               "vary dynamic tensors' sizes per step (half, the hint, 1.5x: the read path)");
  app.add_option("--gflops", gflops,
                 "compute stand-ins: each op sleeps its estimated FLOPs at this rate (0: none)")
      ->capture_default_str();
  app.add_option("--transports", transports, "transports to replay on")
      ->delimiter(',')
      ->default_str("tcp, ucx (when built) and grpc");
  app.add_option("--json", json_out, "write the results as JSON to FILE")->type_name("FILE");
  e2e::HostOptions host_options;
  host_options.add_to(app);
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  const std::optional<e2e::HostLayout> layout = host_options.layout("rdmaflow-replay");
  const double link_seconds = host_options.link_seconds;
  if (layout && layout->slots() < ranks) {
    std::fprintf(stderr, "rdmaflow-replay: --hosts %s has %d slots for %d ranks\n",
                 host_options.hosts.c_str(), layout->slots(), ranks);
    return rdmaflow::cli::kUsageError;
  }
  std::map<std::string, int64_t> dims;
  for (const auto& d : dim_args) {
    if (auto st = rdmaflow::graph::parse_dim_binding(d, dims); !st) {
      std::fprintf(stderr, "rdmaflow-replay: %s\n", st.reason().c_str());
      return rdmaflow::cli::kUsageError;
    }
  }
  if (transports.empty()) {
    for (const auto& n : rdmaflow::transport_backend_names()) {
      if (n == "tcp" || n == "ucx") transports.push_back(n);
    }
    transports.push_back("grpc");
  }
  char abs[4096];
  const std::string model_path = realpath(model.c_str(), abs) ? abs : model;
  if (layout && model_path.rfind("/tmp/", 0) == 0) {
    // Each simulated (and many a real) host has a /tmp of its own.
    std::fprintf(stderr,
                 "rdmaflow-replay: %s is under /tmp, which the hosts do not share: put the model "
                 "where every host sees it\n",
                 model_path.c_str());
    return rdmaflow::cli::kUsageError;
  }

  json job{{"kind", "replay"}, {"model", model_path}, {"dims", dims}, {"train", train},
           {"steps", steps},   {"depth", depth},      {"vary", vary}, {"gflops", gflops}};
  json out{{"model", model_path}, {"ranks", ranks}, {"train", train},  {"steps", steps},
           {"dims", dims},        {"vary", vary},   {"gflops", gflops}};
  double link_MBps = 0;
  if (layout) {
    std::string where;
    for (const auto& h : layout->place(ranks)) where += (where.empty() ? "" : " ") + h;
    std::printf("ranks on %s (hosts %s through mpirun)\n", where.c_str(),
                host_options.hosts.c_str());
    out["hosts"] = host_options.hosts;
    out["placement"] = layout->place(ranks);
  }
  if (link_seconds > 0 && ranks > 1 && (!layout || layout->hosts.size() > 1)) {
    rdmaflow::Result<rdmaflow::bench::LinkRate> link = rdmaflow::bench::LinkRate{};
    if (layout) {
      link = e2e::measure_link(*layout, link_seconds);
    } else {
      e2e::LaunchSpec spec;
      spec.ranks = 2;
      spec.transport = "tcp";
      spec.job = {{"kind", "link"}, {"seconds", link_seconds}, {"streams", 4}};
      auto measured = e2e::launch(spec);
      if (measured) {
        link = rdmaflow::bench::LinkRate::from_json(*measured);
      } else {
        link = measured.status();
      }
    }
    if (link) {
      const auto& rate = *link;
      link_MBps = rate.best_MBps();
      std::printf("link rate measured in this run: %s\n", rate.describe().c_str());
      out["link_rate"] = rate.to_json();
    } else {
      std::printf("link rate: not measured (%s)\n", link.status().reason().c_str());
    }
  }
  std::printf("%s, %d ranks%s, %d steps%s%s\n\n", model.c_str(), ranks, train ? ", training" : "",
              steps, vary ? ", dynamic sizes varied" : "", gflops > 0 ? ", compute stand-ins" : "");
  std::printf("  %-10s %12s %14s %12s %10s %12s %s\n", "transport", "step time", "bytes/step",
              "link bound", "x bound", "vs gRPC", "verified");
  json rows = json::array();
  std::vector<std::pair<std::string, json>> results;
  int failures = 0;
  for (const auto& t : transports) {
    e2e::LaunchSpec spec;
    spec.ranks = ranks;
    spec.hosts = layout ? &*layout : nullptr;
    spec.transport = t;
    spec.job = job;
    spec.env.emplace_back("GLIBC_TUNABLES", e2e::kMallocTunables);
    auto r = e2e::launch(spec);
    if (!r) {
      std::printf("  %-10s failed: %s\n", t.c_str(), r.status().to_string().c_str());
      rows.push_back(json{{"transport", t}, {"error", r.status().to_string()}});
      ++failures;
      continue;
    }
    results.emplace_back(t, *r);
  }
  double grpc_ms = 0;
  for (const auto& [t, r] : results) {
    if (t == "grpc") grpc_ms = r["step_ms_median"].get<double>();
  }
  for (const auto& [t, r] : results) {
    const double ms = r["step_ms_median"].get<double>();
    const uint64_t busiest = busiest_rank_bytes(r);
    const double bound_ms = link_MBps > 0 ? static_cast<double>(busiest) / (link_MBps * 1e3) : 0;
    char bound[32] = "-", ratio[32] = "-", vs[32] = "-";
    if (bound_ms > 0) {
      std::snprintf(bound, sizeof bound, "%.3f ms", bound_ms);
      std::snprintf(ratio, sizeof ratio, "%.2fx", ms / bound_ms);
    }
    if (grpc_ms > 0) std::snprintf(vs, sizeof vs, "%.2fx", grpc_ms / ms);
    std::printf("  %-10s %9.3f ms %14llu %12s %10s %12s %llu B\n", t.c_str(), ms,
                static_cast<unsigned long long>(r["bytes_per_step"].get<uint64_t>()), bound, ratio,
                vs, static_cast<unsigned long long>(r["bytes_verified"].get<uint64_t>()));
    json row = r;
    row["transport"] = t;
    row["link_bound_ms"] = bound_ms;
    row["busiest_rank_bytes_per_step"] = busiest;
    if (grpc_ms > 0) row["vs_grpc"] = grpc_ms / ms;
    rows.push_back(std::move(row));
  }
  if (!results.empty()) {
    std::printf(
        "\n%s: %llu ops, %llu transfers; step time = the slowest rank's median after 3 "
        "warm-up steps;\nlink bound = the busiest rank's bytes in or out per step over the "
        "measured link rate;\nvs gRPC = gRPC's step time / this one's\n",
        results[0].second["model"].get<std::string>().c_str(),
        static_cast<unsigned long long>(results[0].second["ops"].get<uint64_t>()),
        static_cast<unsigned long long>(results[0].second["transfers"].get<uint64_t>()));
  }
  out["rows"] = rows;
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  return failures ? 1 : 0;
}
