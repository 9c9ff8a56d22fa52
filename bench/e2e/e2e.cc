// bench/e2e: training step time per transport, against the gRPC baseline
// measured in the same run (docs/benchmarks.md, "End to end").
//
// Two configurations of parameter-server training on 4 local processes
// (rank 0 the server, ranks 1-3 workers):
//   comm-heavy     large layers, a tiny batch: a step is mostly moving weights
//                  to the workers and gradients back;
//   compute-heavy  small layers, a large batch: a step is mostly matmuls.
// plus one 16 MiB tensor moved between two processes per step (with a 64-byte
// acknowledgement back). Every transport this build has (grpc, tcp, ucx, verbs)
// runs each; one that cannot run here says why. The table gives the median
// step time and the ratio to gRPC, and a profile of one comm-heavy step over
// the auto-chosen transport shows where the time goes on each rank.
//
//   e2e [--steps N] [--transports grpc,tcp,...] [--quick] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/e2e/job.h"
#include "bench/e2e/launch.h"
#include "runtime/session/session.h"
#include "tools/cli.h"
#include "transport/transport.h"

namespace rdmaflow::e2e {
namespace {

using json = nlohmann::json;

struct Config {
  std::string name;
  std::string description;
  json job;
  int ranks = 4;
};

// What RDMAFLOW_TRANSPORT=auto picks between two processes of this host (every
// job this bench launches is local), with its reason: the per-peer rule of
// runtime/selection/transport_select.h applied to this process's own capabilities.
struct AutoChoice {
  std::string transport = "tcp";
  std::string reason;
};
AutoChoice auto_transport() {
  TransportConfig tc;
  LocalProbe probe = probe_transports("auto", tc);
  for (auto& t : probe.transports) t->shutdown();
  AutoChoice c;
  auto d = decide_pair(0, probe.record, 1, probe.record);
  if (d) {
    c.transport = d->transport;
    c.reason = d->reason;
  } else {
    c.reason = d.status().reason();
  }
  return c;
}

int run(int argc, char** argv) {
  int steps = 12;
  bool quick = false;
  std::string json_path;
  std::vector<std::string> transports;
  CLI::App app{
      "Training step time per transport against the gRPC baseline measured in the same run\n"
      "(docs/benchmarks.md, \"End to end\").",
      "e2e"};
  cli::configure(app);
  app.add_option("--steps", steps, "training steps per configuration")->check(cli::at_least(1));
  app.add_option("--transports", transports, "comma-separated transports to run")
      ->delimiter(',')
      ->type_name("NAME,...")
      ->default_str("grpc and every backend built in");
  app.add_flag("--quick", quick, "smaller comm-heavy layers, for a short run");
  app.add_option("--json", json_path, "also write the results to FILE")->type_name("FILE");
  if (auto exit_code = cli::parse(app, argc, argv)) return *exit_code;
  const AutoChoice auto_choice = auto_transport();
  const std::string& chosen = auto_choice.transport;
  // A backend this machine cannot run (verbs without an RDMA device) is reported
  // once with its reason instead of launching ranks that would all fail.
  std::map<std::string, std::optional<std::string>> viability;
  auto not_viable_here = [&](const std::string& t) -> std::optional<std::string> {
    if (t == "grpc") return std::nullopt;
    auto it = viability.find(t);
    if (it != viability.end()) return it->second;
    TransportConfig config;
    auto made = make_transport(t, config);
    std::optional<std::string> why;
    if (made.is_ok()) {
      (*made)->shutdown();
    } else {
      why = made.status().reason();
    }
    viability[t] = why;
    return why;
  };
  if (transports.empty()) {
    transports.push_back("grpc");
    for (const auto& n : transport_backend_names()) transports.push_back(n);
  }
  const int64_t big = quick ? 1024 : 2048;
  std::vector<Config> configs = {
      {"comm-heavy",
       "ps, MLP " + std::to_string(big) + "-" + std::to_string(big) + "-" + std::to_string(big) +
           "-10, batch 3 (1 row per worker)",
       json{{"kind", "train"},
            {"mode", "ps"},
            {"widths", {big, big, big, 10}},
            {"batch", 3},
            {"steps", steps},
            {"lr", 0.01}},
       4},
      {"compute-heavy", "ps, MLP 256-512-512-10, batch 1536 (512 rows per worker)",
       json{{"kind", "train"},
            {"mode", "ps"},
            {"widths", {256, 512, 512, 10}},
            {"batch", 1536},
            {"steps", steps},
            {"lr", 0.01}},
       4},
      {"16 MiB tensor", "one 16 MiB transfer + 64 B ack per step, 2 processes",
       json{{"kind", "transfer"}, {"bytes", 16 << 20}, {"steps", std::max(steps, 20)}}, 2},
  };

  std::printf("bench/e2e: median step time after 2 warm-up steps, %d steps\n", steps);
  std::printf("auto between processes of this host: %s (%s)\n\n", chosen.c_str(),
              auto_choice.reason.c_str());
  std::printf("  %-14s %-10s %12s %14s %10s\n", "config", "transport", "step time", "bytes/step",
              "vs gRPC");
  json out = json::object();
  out["auto"] = chosen;
  out["auto_reason"] = auto_choice.reason;
  json profile;
  for (const auto& cfg : configs) {
    std::printf("  %s: %s\n", cfg.name.c_str(), cfg.description.c_str());
    double grpc_ms = 0;
    json rows = json::array();
    for (const auto& t : transports) {
      if (auto why = not_viable_here(t)) {
        std::printf("  %-14s %-10s   skipped: %s\n", "", t.c_str(), why->c_str());
        rows.push_back(json{{"transport", t}, {"skipped", *why}});
        continue;
      }
      LaunchSpec spec;
      spec.ranks = cfg.ranks;
      spec.transport = t;
      spec.job = cfg.job;
      auto r = launch(spec);
      if (!r) {
        std::printf("  %-14s %-10s   could not run: %s\n", "", t.c_str(),
                    r.status().reason().c_str());
        rows.push_back(json{{"transport", t}, {"error", r.status().to_string()}});
        continue;
      }
      const double ms = r->at("step_ms_median").get<double>();
      if (t == "grpc") grpc_ms = ms;
      const double bytes = r->contains("bytes_per_step") ? r->at("bytes_per_step").get<double>()
                                                         : r->at("bytes").get<double>();
      char ratio[32] = "-";
      if (grpc_ms > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", grpc_ms / ms);
      std::printf("  %-14s %-10s %9.2f ms %11.1f MB %10s\n", "",
                  (t == chosen ? t + "*" : t).c_str(), ms, bytes / 1e6, ratio);
      std::fflush(stdout);
      json row = *r;
      row["vs_grpc"] = grpc_ms > 0 ? grpc_ms / ms : 0.0;
      rows.push_back(row);
      if (cfg.name == "comm-heavy" && t == chosen) profile = *r;
    }
    out[cfg.name] = rows;
  }
  std::printf("  (* = the transport RDMAFLOW_TRANSPORT=auto picks here)\n");

  if (!profile.is_null()) {
    std::printf(
        "\nwhere a comm-heavy step goes over %s (ms per step, mean over the steps after the 2 "
        "warm-up steps)\n",
        chosen.c_str());
    std::printf("  %-6s %8s %9s %8s %8s %9s   %s\n", "rank", "total", "compute", "send", "recv",
                "session", "largest op types");
    for (const auto& r : profile["ranks"]) {
      const json& p = r["profile"];
      std::vector<std::pair<double, std::string>> types;
      for (const auto& [k, v] : p["by_type_ms"].items()) types.emplace_back(v.get<double>(), k);
      std::sort(types.rbegin(), types.rend());
      std::string top;
      for (size_t i = 0; i < types.size() && i < 4; ++i) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s %.1f", i ? ", " : "", types[i].second.c_str(),
                      types[i].first);
        top += buf;
      }
      std::printf("  %-6d %8.1f %9.1f %8.1f %8.1f %9.1f   %s\n", r["rank"].get<int>(),
                  p["total_ms"].get<double>(), p["compute_ms"].get<double>(),
                  p["send_ms"].get<double>(), p["recv_ms"].get<double>(),
                  p["session_ms"].get<double>(), top.c_str());
    }
    out["profile"] = profile;
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << out.dump(1) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace rdmaflow::e2e

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--e2e-worker") == 0) return rdmaflow::e2e::worker_main();
  return rdmaflow::e2e::run(argc, argv);
}
