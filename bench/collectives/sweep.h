// The columns of rdmaflow_coll_bench and how a size's columns are timed:
// interleaved, in rounds. One schedule measured twice a few seconds apart
// differed by more than 10% on a loaded machine (hier 1.37x of hier at 256
// KiB, docs/benchmarks.md), so comparing columns timed one after the other
// says more about the machine's moment than about the algorithms. Each round
// runs every column once (a share of the iterations each, the starting column
// rotated from round to round); a column's time is the median of its rounds'
// medians, so a round that a neighbour's burst slowed moves no column's figure
// much, and every column saw the same moments of the run.
#pragma once

#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/collectives/check_data.h"
#include "bench/cpu_load.h"
#include "common/counters.h"

namespace rdmaflow::bench {

// One column: rdmaflow's selector, a forced algorithm, a codec or a reference library.
template <typename Args>
struct Column {
  std::string name;
  std::function<bool(const Args&, size_t count)> supports;
  std::function<void(const Args&, size_t count, Bufs&)> run;  // aborts on failure
  std::function<std::string(const Args&, size_t count)> algo;
  // Collective, before a size's rounds (none: nothing to do): a reference
  // that picks its algorithm per size by a trial does it here, untimed.
  std::function<void(const Args&, size_t count, Bufs&)> prepare = {};
};

// Every rank out of MPI's last call with its messages gone, before a column
// that waits outside MPI (rdmaflow, Gloo, the plain sockets). Open MPI counts
// a small (eager) send done once it is queued, and a queued fragment leaves
// only while its rank calls into MPI. So a rank whose MPI_Reduce message
// found its socket still full of the MPI column's last bytes can return with
// it queued and wait in the next column for a peer that waits in MPI_Reduce
// for that message. That is how we read the 8 x 1 hang at 64 MiB
// (2026-11-28): after Open MPI's column, ranks 1, 3 and 5 saw nothing from
// 0, 2 and 4 (their parents in the reduce) in the plain sockets' ring for 60
// s. In a barrier every rank calls into MPI until all have come, so what
// each was waiting for has left.
inline void settle_mpi() {
  MPI_Barrier(MPI_COMM_WORLD);
}

inline double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  i = std::min(v.size() - 1, i == 0 ? 0 : i - 1);
  return v[i];
}

// Payload bytes this process's channels sent to every peer so far (writes and
// messages, common/counters.h). Stores through a same-host direct view are not
// counted.
inline uint64_t bytes_sent_to_peers() {
  uint64_t total = 0;
  for (const stats::PeerStats& p : stats::snapshot().peers) total += p.bytes_sent;
  return total;
}

// CPU seconds this process (every thread, user and system) has used so far.
inline double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// What one column measured at one size, over every round.
struct Samples {
  std::vector<double> slowest;    // rank 0: every timed call, the slowest rank's time (us)
  std::vector<double> round_p50;  // rank 0: the median of each round
  CpuJiffies cpu;                 // this host's jiffies while the column's calls ran
  uint64_t sent = 0;              // this rank's channel bytes in those calls
  double cpu_seconds = 0;         // this rank's process CPU time in those calls
  int calls = 0;

  // The column's time: the median of the rounds' medians (one round: the
  // median of its calls).
  double p50() const { return pct(round_p50, 0.5); }
  // The share of the host's CPUs busy while the column ran; -1 when the
  // calls were too short for the jiffies to tell.
  double cpu_busy() const {
    return cpu.busy + cpu.idle >= 50 ? cpu.busy / (cpu.busy + cpu.idle) : -1;
  }
};

// Times every supported column of one size `rounds` times, interleaved
// (after each column's `prepare`):
// round r starts at column r (mod the columns) and gives each column
// `iters` / `rounds` calls (at least one), after `warmup` untimed calls in the
// first round and one in each later one (the previous column's schedule and
// buffers are what a switch leaves behind). Every rank calls it with the same
// arguments; the slowest rank's times are gathered on rank 0.
template <typename Args>
std::vector<Samples> time_interleaved(std::vector<Column<Args>>& libs,
                                      const std::vector<bool>& supported, const Args& a,
                                      size_t count, Bufs& b, int iters, int rounds, int warmup,
                                      int rank, const std::string& size_name) {
  using Clock = std::chrono::steady_clock;
  std::vector<Samples> out(libs.size());
  const int per_round = std::max(1, (iters + rounds - 1) / rounds);
  for (size_t l = 0; l < libs.size(); ++l) {
    if (!supported[l] || !libs[l].prepare) continue;
    settle_mpi();
    libs[l].prepare(a, count, b);
  }
  for (int r = 0; r < rounds; ++r) {
    if (rank == 0 && rounds > 1) {
      std::fprintf(stderr, "# %s: round %d of %d\n", size_name.c_str(), r + 1, rounds);
    }
    for (size_t k = 0; k < libs.size(); ++k) {
      const size_t l = (k + static_cast<size_t>(r)) % libs.size();
      if (!supported[l]) continue;
      Samples& s = out[l];
      settle_mpi();
      for (int w = 0; w < (r == 0 ? warmup : std::min(warmup, 1)); ++w) libs[l].run(a, count, b);
      // Start together, then time each call back to back.
      MPI_Barrier(MPI_COMM_WORLD);
      std::vector<double> times(per_round);
      const CpuJiffies cpu0 = cpu_jiffies();
      const uint64_t sent0 = bytes_sent_to_peers();
      const double own0 = process_cpu_seconds();
      for (int it = 0; it < per_round; ++it) {
        auto t0 = Clock::now();
        libs[l].run(a, count, b);
        times[it] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      }
      s.cpu_seconds += process_cpu_seconds() - own0;
      const CpuJiffies cpu1 = cpu_jiffies();
      s.cpu.busy += cpu1.busy - cpu0.busy;
      s.cpu.idle += cpu1.idle - cpu0.idle;
      s.sent += bytes_sent_to_peers() - sent0;
      s.calls += per_round;
      std::vector<double> slowest(per_round);
      MPI_Reduce(times.data(), slowest.data(), per_round, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rank != 0) continue;
      s.slowest.insert(s.slowest.end(), slowest.begin(), slowest.end());
      s.round_p50.push_back(pct(slowest, 0.5));
    }
  }
  return out;
}

// --algo all: the fastest of the row's forced `algos`, and the selector's
// choice (the "rdmaflow" column) as a multiple of its time, on a line
// of its own and in the row's JSON ("selector"). Both are medians of the same
// interleaved rounds. `forced_same` is the forced column of the algorithm the
// selector took: the two time one schedule, so their gap is the run's noise.
inline void note_selector(const std::vector<std::string>& algos, nlohmann::json& row) {
  const auto& auto_row = row["rdmaflow"];
  if (!auto_row.contains("time_us")) return;
  std::string fastest;
  double best = 0;
  for (const std::string& name : algos) {
    if (!row.contains(name) || !row[name].contains("time_us")) continue;
    const double t = row[name]["time_us"].get<double>();
    if (fastest.empty() || t < best) {
      fastest = name;
      best = t;
    }
  }
  if (fastest.empty()) return;
  const std::string chose = auto_row["algo"].get<std::string>();
  const double ratio = auto_row["time_us"].get<double>() / best;
  row["selector"] = {{"chose", chose}, {"fastest", fastest}, {"time_vs_fastest", ratio}};
  std::string same;
  if (row.contains(chose) && row[chose].contains("time_us")) {
    const double forced = row[chose]["time_us"].get<double>();
    row["selector"]["forced_same_us"] = forced;
    char buf[96];
    std::snprintf(buf, sizeof(buf), " (%s forced: %.2fx the fastest)", chose.c_str(),
                  forced / best);
    same = buf;
  }
  std::printf("#   fastest %s (%.1f us); the selector took %s: %.2fx its time%s\n", fastest.c_str(),
              best, chose.c_str(), ratio, same.c_str());
}

}  // namespace rdmaflow::bench
