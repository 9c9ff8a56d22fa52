// The command-line options that put the demo's and bench/e2e's ranks on hosts
// (bench/e2e/launch.h, HostLayout), shared by both tools.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/e2e/launch.h"
#include "tools/cli.h"

namespace rdmaflow::e2e {

struct HostOptions {
  std::string hosts;  // "h0:2,h1:2"; empty: fork on this host
  std::string rsh_agent;
  std::vector<std::string> mpirun_args;
  double link_seconds = 2;

  void add_to(CLI::App& app) {
    app.add_option("--hosts", hosts,
                   "run the ranks on these hosts through mpirun (HOST[:SLOTS],...; by slot, a "
                   "2-rank job one rank per host)")
        ->type_name("LIST");
    app.add_option("--rsh-agent", rsh_agent,
                   "mpirun's rsh agent (--mca plm_rsh_agent), e.g. \"$PWD/scripts/cluster rsh\"")
        ->type_name("CMD");
    app.add_option("--mpirun-arg", mpirun_args, "one more argument for mpirun; repeat for several")
        ->allow_extra_args(false)
        ->type_name("ARG");
    app.add_option(
           "--link-seconds", link_seconds,
           "each link-rate measurement (1 stream, then 4; e2e and the demo measure only with "
           "--hosts); 0 skips it")
        ->check(cli::at_least(0.0));
  }

  // The layout, or nullopt on this host; exits with a usage error on a bad list.
  std::optional<HostLayout> layout(const char* tool) const {
    if (hosts.empty()) {
      if (!rsh_agent.empty() || !mpirun_args.empty()) {
        std::fprintf(stderr, "%s: --rsh-agent and --mpirun-arg need --hosts\n", tool);
        std::exit(cli::kUsageError);
      }
      return std::nullopt;
    }
    auto l = HostLayout::parse(hosts);
    if (!l) {
      std::fprintf(stderr, "%s: --hosts: %s\n", tool, l.status().reason().c_str());
      std::exit(cli::kUsageError);
    }
    l->rsh_agent = rsh_agent;
    l->mpirun_args = mpirun_args;
    return *l;
  }
};

}  // namespace rdmaflow::e2e
