// Competing load for the benchmarks' --load N (bench/p2p, p2p-session,
// rdmaflow_coll_bench): what a busy machine (a build running beside the job)
// takes from the measured processes, reproducibly.
#pragma once

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace rdmaflow::bench {

// N child processes, each a plain CPU loop at the default nice level and
// scheduling policy, started when this object is made and killed when it goes
// away (or when this process dies: PR_SET_PDEATHSIG). They touch no memory
// and make no system calls, like a compiler's code generation: what they take
// from the measured processes is CPU time alone.
class CpuLoad {
 public:
  explicit CpuLoad(int n) {
    std::fflush(nullptr);
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid < 0) {
        std::fprintf(stderr, "--load: fork failed: %s\n", std::strerror(errno));
        std::exit(1);
      }
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() == 1) std::_Exit(0);  // the parent is already gone
        for (uint64_t x = 0;; ++x) asm volatile("" : : "r"(x));
      }
      pids_.push_back(pid);
    }
  }
  ~CpuLoad() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
  }
  CpuLoad(const CpuLoad&) = delete;
  CpuLoad& operator=(const CpuLoad&) = delete;

 private:
  std::vector<pid_t> pids_;
};

// Busy and idle jiffies of all of this host's CPUs (/proc/stat): the share of
// busy time over a timed loop says whether it ran out of cores before it ran
// out of link (between simulated hosts every rank shares these cores).
struct CpuJiffies {
  double busy = 0, idle = 0;
};
inline CpuJiffies cpu_jiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[8] = {};
  f >> cpu;
  for (double& x : v) f >> x;
  if (!f || cpu != "cpu") return {};
  // user nice system idle iowait irq softirq steal
  return {v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v[3] + v[4]};
}
// -1 when the loop was too short for jiffies (10 ms each) to tell.
inline double cpu_busy_since(const CpuJiffies& start) {
  const CpuJiffies now = cpu_jiffies();
  const double busy = now.busy - start.busy, total = busy + now.idle - start.idle;
  return total >= 50 ? busy / total : -1;
}

}  // namespace rdmaflow::bench
