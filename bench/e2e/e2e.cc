// bench/e2e: training step time per transport, against the gRPC baseline
// measured in the same run (docs/benchmarks.md, "End to end").
//
// Two configurations of parameter-server training on 4 processes (rank 0 the
// server, ranks 1-3 workers), on this host or, with --hosts, on the hosts of a
// cluster through mpirun (bench/e2e/launch.h):
//   comm-heavy     large layers, a tiny batch: a step is mostly moving weights
//                  to the workers and gradients back;
//   compute-heavy  small layers, a large batch: a step is mostly matmuls.
// plus one 16 MiB tensor moved between two processes per step (with a 64-byte
// acknowledgement back). Every transport this build has (grpc, tcp, ucx, verbs)
// runs each; one that cannot run here says why. Every row runs with the malloc
// tunables of docs/grpc-baseline.md (gRPC is several times faster with them),
// plus one gRPC row with glibc's default malloc, labelled. The table gives the
// medium, the median step time and the ratio to gRPC, with the like-for-like
// line (tcp against gRPC, both over sockets) under each configuration, and a
// profile of one comm-heavy step over the auto-chosen transport shows where the
// time goes on each rank.
//
// Across hosts the run first measures the link rate between two of them
// (plain TCP sockets, bench/link_rate.h) and prints beside each configuration
// its link bound: the bytes the busiest host link carries per step (from the
// plan and where the ranks run) over that rate, a lower bound on the step time
// of any transport over that network.
//
//   e2e [--steps N] [--transports grpc,tcp,...] [--quick] [--json FILE]
//   e2e --hosts h0:2,h1:2 --rsh-agent "$PWD/scripts/cluster rsh"   (docs/cluster.md)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bench/e2e/host_options.h"
#include "bench/e2e/job.h"
#include "bench/e2e/launch.h"
#include "bench/link_rate.h"
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

// A row of the table: a transport, and whether its ranks run with glibc's
// default malloc instead of kMallocTunables ("grpc:default-malloc").
struct Row {
  std::string transport;
  bool default_malloc = false;
  std::string label() const { return default_malloc ? transport + ":default-malloc" : transport; }
};
Row parse_row(const std::string& name) {
  const std::string suffix = ":default-malloc";
  if (name.size() > suffix.size() && name.ends_with(suffix)) {
    return {name.substr(0, name.size() - suffix.size()), true};
  }
  return {name, false};
}

// What RDMAFLOW_TRANSPORT=auto picks for a job with ranks on `placement`:
// "ucx+tcp" when pairs within a host and across hosts pick differently.
std::string auto_for(const HostView& host, const std::vector<std::string>& placement) {
  const std::set<std::string> distinct(placement.begin(), placement.end());
  if (distinct.size() <= 1) return host.auto_transport;
  if (distinct.size() == placement.size() || host.auto_transport == host.auto_across) {
    return host.auto_across;
  }
  return host.auto_transport + "+" + host.auto_across;
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
  app.add_option("--transports", transports,
                 "comma-separated transports to run; NAME:default-malloc runs NAME with glibc's "
                 "default malloc instead of the tunables every other row gets")
      ->delimiter(',')
      ->type_name("NAME,...")
      ->default_str("grpc, grpc:default-malloc and every backend built in");
  app.add_flag("--quick", quick, "smaller comm-heavy layers, for a short run");
  app.add_option("--json", json_path, "also write the results to FILE")->type_name("FILE");
  HostOptions host_options;
  host_options.add_to(app);
  if (auto exit_code = cli::parse(app, argc, argv)) return *exit_code;
  const std::optional<HostLayout> layout = host_options.layout("e2e");
  if (layout && layout->slots() < 4) {
    std::fprintf(stderr, "e2e: --hosts %s has %d slots; the training configurations run 4 ranks\n",
                 host_options.hosts.c_str(), layout->slots());
    return cli::kUsageError;
  }
  const HostView host = host_view(layout ? &*layout : nullptr);
  const std::string& chosen = host.auto_transport;
  // A backend this machine cannot run (verbs without an RDMA device) is reported
  // once with its reason instead of launching ranks that would all fail.
  std::map<std::string, std::optional<std::string>> viability;
  auto not_viable_here = [&](const std::string& t) -> std::optional<std::string> {
    if (t == "grpc" || t == "auto") return std::nullopt;
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
    transports.push_back("grpc:default-malloc");
    for (const auto& n : transport_backend_names()) transports.push_back(n);
    // Across hosts auto mixes backends (shared memory within a host, the
    // network between), which no single backend's row shows.
    if (layout) transports.push_back("auto");
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

  json out = json::object();
  std::printf("bench/e2e: median step time after 2 warm-up steps, %d steps, %s\n", steps,
              layout ? ("hosts " + host_options.hosts + " through mpirun").c_str() : "one host");
  std::printf("every row runs with GLIBC_TUNABLES=%s\n", kMallocTunables);
  std::printf("  (docs/grpc-baseline.md) except the :default-malloc row, labelled\n");
  std::printf("auto between processes of this host: %s (%s)\n", chosen.c_str(),
              host.auto_reason.c_str());
  double link_MBps = 0;
  if (layout) {
    std::printf("auto between hosts: %s (%s)\n", host.auto_across.c_str(),
                host.auto_across_reason.c_str());
    out["hosts"] = host_options.hosts;
    out["auto_across"] = host.auto_across;
    if (layout->hosts.size() > 1 && host_options.link_seconds > 0) {
      auto link = measure_link(*layout, host_options.link_seconds);
      if (!link) {
        std::fprintf(stderr, "e2e: link rate: %s\n", link.status().to_string().c_str());
        return 1;
      }
      link_MBps = link->best_MBps();
      std::printf("link rate measured in this run: %s\n", link->describe().c_str());
      out["link_rate"] = link->to_json();
    }
  }
  const int medium_width = layout ? 44 : 24;
  std::printf("\n  %-14s %-22s %-*s %12s %14s %10s%s\n", "config", "transport", medium_width,
              "medium", "step time", "bytes/step", "vs gRPC", link_MBps > 0 ? "   x bound" : "");
  out["auto"] = chosen;
  out["auto_reason"] = host.auto_reason;
  out["malloc_tunables"] = kMallocTunables;
  json profile;
  for (const auto& cfg : configs) {
    std::printf("  %s: %s\n", cfg.name.c_str(), cfg.description.c_str());
    // Where the ranks run, and the bound the busiest link sets on a step.
    std::vector<std::string> placement(static_cast<size_t>(cfg.ranks), "this host");
    double bound_ms = 0;
    if (layout) {
      placement = layout->place(cfg.ranks);
      std::string where;
      for (const auto& h : placement) where += (where.empty() ? "" : " ") + h;
      auto traffic = job_traffic(cfg.job, cfg.ranks);
      const double busiest =
          traffic ? static_cast<double>(busiest_link_bytes(*traffic, placement)) : 0;
      if (link_MBps > 0) bound_ms = busiest / (link_MBps * 1e6) * 1e3;
      std::printf("  %-14s ranks on %s; busiest host link %.1f MB/step", "", where.c_str(),
                  busiest / 1e6);
      if (link_MBps > 0) std::printf(" -> link bound %.2f ms/step", bound_ms);
      std::printf("\n");
      out["placement"][cfg.name] = placement;
      out["link_bound"][cfg.name] = {{"busiest_link_bytes_per_step", busiest},
                                     {"link_MBps", link_MBps},
                                     {"bound_ms", bound_ms}};
    }
    double grpc_ms = 0;
    double tcp_ms = 0;
    json rows = json::array();
    for (const auto& name : transports) {
      const Row row = parse_row(name);
      const std::string& t = row.transport;
      if (auto why = not_viable_here(t)) {
        std::printf("  %-14s %-22s   skipped: %s\n", "", name.c_str(), why->c_str());
        rows.push_back(json{{"transport", name}, {"skipped", *why}});
        continue;
      }
      LaunchSpec spec;
      spec.ranks = cfg.ranks;
      spec.hosts = layout ? &*layout : nullptr;
      spec.transport = t;
      spec.job = cfg.job;
      if (!row.default_malloc) spec.env.emplace_back("GLIBC_TUNABLES", kMallocTunables);
      auto r = launch(spec);
      if (!r) {
        std::printf("  %-14s %-22s   could not run: %s\n", "", name.c_str(),
                    r.status().reason().c_str());
        rows.push_back(json{{"transport", name}, {"error", r.status().to_string()}});
        continue;
      }
      const double ms = r->at("step_ms_median").get<double>();
      if (t == "grpc" && !row.default_malloc) grpc_ms = ms;
      if (t == "tcp" && !row.default_malloc) tcp_ms = ms;
      const double bytes = r->contains("bytes_per_step") ? r->at("bytes_per_step").get<double>()
                                                         : r->at("bytes").get<double>();
      const std::string medium_text = host.medium_text(t, placement);
      char ratio[32] = "-";
      if (grpc_ms > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", grpc_ms / ms);
      const bool is_auto = t == "auto" || t == auto_for(host, placement);
      std::string shown = is_auto && !row.default_malloc ? name + "*" : name;
      std::printf("  %-14s %-22s %-*s %9.2f ms %11.1f MB %10s", "", shown.c_str(), medium_width,
                  medium_text.c_str(), ms, bytes / 1e6, ratio);
      if (bound_ms > 0) std::printf(" %8.2fx", ms / bound_ms);
      std::printf("\n");
      std::fflush(stdout);
      json j = *r;
      j["transport"] = name;
      j["medium"] = medium_text;
      j["malloc"] = row.default_malloc ? "glibc default" : kMallocTunables;
      j["vs_grpc"] = grpc_ms > 0 ? grpc_ms / ms : 0.0;
      if (bound_ms > 0) j["vs_link_bound"] = ms / bound_ms;
      rows.push_back(j);
      if (cfg.name == "comm-heavy" && is_auto && !row.default_malloc) profile = *r;
    }
    // The headline is like for like: rdmaflow's tcp against gRPC, both over
    // sockets on the same network, gRPC with the tunables.
    if (grpc_ms > 0 && tcp_ms > 0) {
      std::printf("  %-14s like for like (both over sockets%s): tcp is %.2fx gRPC\n", "",
                  layout ? ", same hosts" : "", grpc_ms / tcp_ms);
      out["like_for_like"][cfg.name] = grpc_ms / tcp_ms;
    }
    out[cfg.name] = rows;
  }
  std::printf(
      "  (* = the transport RDMAFLOW_TRANSPORT=auto picks here; vs gRPC = gRPC's step time with\n"
      "   the tunables / the row's; shared memory moves only between ranks of one host and is\n"
      "   not comparable with gRPC over a socket%s)\n",
      link_MBps > 0 ? "; x bound = step time / link bound" : "");

  if (!profile.is_null()) {
    std::printf(
        "\nwhere a comm-heavy step goes over %s (ms per step, mean over the steps after the 2 "
        "warm-up steps)\n",
        profile.value("transport", chosen).c_str());
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
