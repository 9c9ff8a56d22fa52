// rdmaflow-demo: the end-to-end demo (README's first command runs it).
//
// Launches 4 local processes that train an MLP with a parameter server (rank 0
// holds the weights, ranks 1-3 are workers with a third of the batch each) for
// a fixed number of steps: over the transport rdmaflow picks by itself
// (RDMAFLOW_TRANSPORT=auto; shared memory on one host), over its TCP backend,
// and over the gRPC baseline (TensorFlow-style RecvTensor pulls, with the
// malloc tunables of docs/grpc-baseline.md), with the same executor and the
// same plan. Prints the loss curves, a table of step time, bytes moved per step
// and the speedup, and checks the trained weights against a single-process run
// of the same graph. The headline ratio is like for like: tcp against gRPC,
// both over sockets.
//
// With --hosts the processes run on the hosts of a cluster through mpirun
// (bench/e2e/launch.h; docs/cluster.md), the link rate between two of them is
// measured first, and the table gives the link bound of a step beside the
// step times (bench/e2e/e2e.cc says how).
//
//   rdmaflow-demo [--steps N] [--widths 784,2048,2048,10] [--batch 48]
//                 [--transports auto,tcp,grpc] [--ranks 4] [--json]
//                 [--hosts h0:2,h1:2 --rsh-agent "$PWD/scripts/cluster rsh"]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/e2e/host_options.h"
#include "bench/e2e/job.h"
#include "bench/e2e/launch.h"
#include "bench/link_rate.h"
#include "examples/trainer/trainer.h"
#include "tools/cli.h"

namespace rdmaflow::e2e {
namespace {

using json = nlohmann::json;

struct Options {
  int ranks = 4;
  int steps = 30;
  int64_t batch = 48;
  std::vector<int64_t> widths = {784, 2048, 2048, 10};
  std::vector<std::string> transports = {"auto", "tcp", "grpc"};
  double lr = 0.1;
  bool json_out = false;
  HostOptions hosts;
};

// Returns the exit status when the command line says not to run (--help, or a
// bad command line).
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{
      "The end-to-end demo: parameter-server training of an MLP on local processes over the\n"
      "transport rdmaflow picks and over the gRPC baseline, checked against a single-process run.",
      "rdmaflow-demo"};
  cli::configure(app);
  app.add_option("--steps", o.steps, "training steps")->check(cli::at_least(1));
  app.add_option("--widths", o.widths, "layer widths of the MLP, input first")
      ->delimiter(',')
      ->type_name("N,...")
      ->default_str("784,2048,2048,10")
      ->check(cli::at_least(1));
  app.add_option("--batch", o.batch, "rows per step, split among the workers")
      ->check(cli::at_least(1));
  app.add_option("--transports", o.transports, "comma-separated transports, one run each")
      ->delimiter(',')
      ->type_name("NAME,...")
      ->default_str("auto,tcp,grpc");
  app.add_option("--ranks", o.ranks, "local processes (rank 0 holds the weights)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--lr", o.lr, "SGD learning rate");
  app.add_flag("--json", o.json_out, "also print the results as JSON");
  o.hosts.add_to(app);
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  if (o.widths.size() < 2 || o.transports.empty()) {
    std::fprintf(stderr,
                 "rdmaflow-demo: --widths needs at least two layers, --transports one name\n");
    return cli::kUsageError;
  }
  return std::nullopt;
}

std::string widths_text(const std::vector<int64_t>& w) {
  std::string s;
  for (size_t i = 0; i < w.size(); ++i) s += (i ? "-" : "") + std::to_string(w[i]);
  return s;
}

int run(const Options& o) {
  const int workers = o.ranks - 1;
  const std::optional<HostLayout> layout = o.hosts.layout("rdmaflow-demo");
  const HostLayout* hosts = layout ? &*layout : nullptr;
  if (layout && o.ranks > layout->slots()) {
    std::fprintf(stderr, "rdmaflow-demo: --ranks %d, but --hosts %s has %d slots\n", o.ranks,
                 o.hosts.hosts.c_str(), layout->slots());
    return cli::kUsageError;
  }
  std::vector<std::string> placement(static_cast<size_t>(o.ranks), "this host");
  std::string where = std::to_string(o.ranks) + " local processes";
  if (layout) {
    placement = layout->place(o.ranks);
    where = std::to_string(o.ranks) + " processes on";
    for (const auto& h : placement) where += " " + h;
  }
  std::printf(
      "rdmaflow demo: parameter-server training of an MLP %s on synthetic data\n"
      "  %s (rank 0 holds the weights, %d workers with %lld rows each), "
      "%d steps, SGD lr %.2g\n"
      "  each step the workers pull every weight and push every gradient through the Session\n",
      widths_text(o.widths).c_str(), where.c_str(), workers,
      static_cast<long long>(o.batch / std::max(1, workers)), o.steps, o.lr);
  double link_MBps = 0;
  if (layout && layout->hosts.size() > 1 && o.hosts.link_seconds > 0) {
    auto link = measure_link(*layout, o.hosts.link_seconds);
    if (!link) {
      std::fprintf(stderr, "rdmaflow-demo: link rate: %s\n", link.status().to_string().c_str());
      return 1;
    }
    link_MBps = link->best_MBps();
    std::printf("  link rate measured in this run: %s\n", link->describe().c_str());
  }
  std::printf("\n");
  std::fflush(stdout);

  exec::TrainConfig c;
  c.mode = exec::MlpMode::kParameterServer;
  c.model.widths = o.widths;
  c.model.batch = o.batch;
  c.model.learning_rate = o.lr;
  c.steps = o.steps;
  c.servers = 1;
  c.seed = 1;

  struct Run {
    std::string label;
    json result;
    std::map<std::string, std::vector<float>> weights;
  };
  std::vector<Run> runs;
  for (const auto& t : o.transports) {
    auto weights_path = shared_path(hosts, "weights");
    if (!weights_path) {
      std::fprintf(stderr, "%s\n", weights_path.status().to_string().c_str());
      return 1;
    }
    const std::string weights = *weights_path;
    LaunchSpec spec;
    spec.ranks = o.ranks;
    spec.hosts = hosts;
    spec.transport = t;
    spec.env.emplace_back("GLIBC_TUNABLES", kMallocTunables);
    spec.job =
        json{{"kind", "train"},  {"mode", "ps"},          {"widths", o.widths}, {"batch", o.batch},
             {"steps", o.steps}, {"servers", 1},          {"lr", o.lr},         {"seed", c.seed},
             {"progress", t},    {"weights_out", weights}};
    auto r = launch(spec);
    if (!r) {
      std::remove(weights.c_str());
      std::fprintf(stderr, "\ndemo over %s failed: %s\n", t.c_str(),
                   r.status().to_string().c_str());
      return 1;
    }
    auto w = read_weights(weights);
    std::remove(weights.c_str());
    if (!w) {
      std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
      return 1;
    }
    runs.push_back({t, std::move(*r), std::move(*w)});
  }

  // The same graph in one process, for the weights check.
  std::printf("\n  single-process reference run of the same graph...");
  std::fflush(stdout);
  auto reference = exec::train_single(c, o.ranks);
  if (!reference) {
    std::fprintf(stderr, "\n%s\n", reference.status().to_string().c_str());
    return 1;
  }
  std::printf(" done\n\n");

  // Loss curves.
  std::printf("loss (mean over the workers' shards)\n  %5s", "step");
  for (const auto& r : runs) {
    std::printf("  %12s", (r.label + ":" + r.result["transport"].get<std::string>()).c_str());
  }
  std::printf("  %12s\n", "single");
  const int every = std::max(1, o.steps / 10);
  for (int s = 0; s < o.steps; ++s) {
    if (s % every != 0 && s != o.steps - 1) continue;
    std::printf("  %5d", s);
    for (const auto& r : runs)
      std::printf("  %12.4f", r.result["loss"][static_cast<size_t>(s)].get<double>());
    std::printf("  %12.4f\n", reference->loss[static_cast<size_t>(s)]);
  }

  // Step time, bytes and speedup. gRPC runs over a socket, so the headline is
  // the row over a socket too (tcp); a shared-memory row is labelled same-host.
  const HostView host = host_view(hosts);
  // The bound the busiest host link sets on a step (the same plan for every row).
  double bound_ms = 0;
  if (layout && link_MBps > 0) {
    json job{{"kind", "train"},  {"mode", "ps"},     {"widths", o.widths},
             {"batch", o.batch}, {"steps", o.steps}, {"servers", 1}};
    if (auto traffic = job_traffic(job, o.ranks)) {
      const double busiest = static_cast<double>(busiest_link_bytes(*traffic, placement));
      bound_ms = busiest / (link_MBps * 1e6) * 1e3;
      std::printf("\n  busiest host link %.1f MB/step at %.0f MB/s: link bound %.2f ms/step\n",
                  busiest / 1e6, link_MBps, bound_ms);
    }
  }
  const json* grpc = nullptr;
  const json* tcp = nullptr;
  for (const auto& r : runs) {
    if (r.label == "grpc") grpc = &r.result;
    if (r.label == "tcp") tcp = &r.result;
  }
  const int medium_width = layout ? 44 : 26;
  std::printf("\n  %-14s %-*s %12s %18s %17s%s\n", "transport", medium_width, "medium", "step time",
              "bytes moved/step", "speedup vs gRPC", bound_ms > 0 ? "   x bound" : "");
  for (const auto& r : runs) {
    const double ms = r.result["step_ms_median"].get<double>();
    const double mb = r.result["bytes_per_step"].get<double>() / 1e6;
    std::string speed = "-";
    if (grpc) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2fx", grpc->at("step_ms_median").get<double>() / ms);
      speed = buf;
    }
    std::string name = r.result["transport"].get<std::string>();
    if (r.label != name) name += " (" + r.label + ")";
    std::printf("  %-14s %-*s %9.1f ms %15.1f MB %17s", name.c_str(), medium_width,
                host.medium_text(r.label, placement).c_str(), ms, mb, speed.c_str());
    if (bound_ms > 0) std::printf(" %8.2fx", ms / bound_ms);
    std::printf("\n");
  }
  if (grpc && tcp) {
    std::printf(
        "\n  like for like, both over sockets %s: rdmaflow tcp is %.2fx gRPC\n"
        "  (gRPC with GLIBC_TUNABLES=%s)\n",
        layout ? "between the same hosts" : "on this host",
        grpc->at("step_ms_median").get<double>() / tcp->at("step_ms_median").get<double>(),
        kMallocTunables);
  }
  if (layout) {
    std::printf("  (shared memory moves only between ranks of one host%s)\n",
                bound_ms > 0 ? "; x bound = step time / link bound" : "");
  }

  // Weights against the single-process run.
  constexpr double kTolerance = 1e-6;
  bool agree = true;
  std::printf("\n  trained weights vs the single-process run (tolerance %.0e):", kTolerance);
  for (const auto& r : runs) {
    double worst = 0;
    size_t compared = 0;
    for (const auto& [name, v] : reference->variables) {
      auto it = r.weights.find(name);
      if (it == r.weights.end() || it->second.size() != v.size()) {
        worst = INFINITY;
        continue;
      }
      for (size_t i = 0; i < v.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(it->second[i] - v[i])));
      }
      compared += v.size();
    }
    agree &= worst <= kTolerance;
    std::printf("  %s max |diff| %.1e over %zu values%s",
                r.result["transport"].get<std::string>().c_str(), worst, compared,
                worst <= kTolerance ? "" : " (DISAGREE)");
  }
  std::printf("\n  %s\n", agree ? "agree" : "DO NOT AGREE");

  if (o.json_out) {
    json all = json::array();
    for (const auto& r : runs) all.push_back(r.result);
    std::printf("%s\n", all.dump().c_str());
  }
  return agree ? 0 : 1;
}

}  // namespace
}  // namespace rdmaflow::e2e

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--e2e-worker") == 0) return rdmaflow::e2e::worker_main();
  rdmaflow::e2e::Options o;
  if (auto exit_code = rdmaflow::e2e::parse(argc, argv, o)) return *exit_code;
  return rdmaflow::e2e::run(o);
}
