// RDMAFLOW_COLL_BIND (collectives/communicator_config.cc): where the communicator puts
// the threads of a rank that nobody bound, over every backend (their progress
// threads start before the communicator does).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

class CollectivesBind : public ::testing::TestWithParam<BackendRow> {
 protected:
  const BackendRow& backend() const { return GetParam(); }
};

// The CPUs of every thread of this process: one set if they all agree, else empty.
std::vector<int> process_cpus() {
  std::vector<int> cpus;
  bool first = true;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return {};
  while (const dirent* e = readdir(dir)) {
    const int tid = std::atoi(e->d_name);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (tid <= 0 || sched_getaffinity(tid, sizeof(set), &set) != 0) continue;
    std::vector<int> mine;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) mine.push_back(c);
    }
    if (!first && mine != cpus) cpus.clear();
    if (first) cpus = mine;
    first = false;
  }
  closedir(dir);
  return cpus;
}

// RDMAFLOW_COLL_BIND=1 binds every thread of an unbound rank to the CPU of its
// launcher's local rank (the progress threads started before the communicator
// too), and the calls still give the right sums; without a local rank it binds
// nothing; a value other than 0 or 1 is refused, naming the knob.
TEST_P(CollectivesBind, PutsEachRankOnItsOwnCpu) {
  const std::vector<int> all = process_cpus();
  if (all.size() < 2 || static_cast<long>(all.size()) < sysconf(_SC_NPROCESSORS_ONLN)) {
    GTEST_SKIP() << "needs an unbound process on 2 or more CPUs";
  }
  auto r = run_ranks(2, [&](int rank, int n, Exchange& ex) {
    unsetenv("OMPI_MCA_mpi_yield_when_idle");
    unsetenv("OMPI_MCA_mpi_oversubscribe");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("RDMAFLOW_COLL_BIND", "1", 1);
    CommNode node;
    RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
    EXPECT_EQ(process_cpus(), std::vector<int>{all[static_cast<size_t>(rank)]}) << "rank " << rank;
    CallSpec c{CollectiveKind::kAllreduce, Algorithm::kAuto, DataType::kF32, ReduceOp::kSum,
               (1 << 18) + 5};
    RF_ASSERT_OK(check_call(*node.comm, c));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
  r = run_ranks(1, [&](int rank, int n, Exchange& ex) {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
      unsetenv(name);
    }
    setenv("RDMAFLOW_COLL_BIND", "1", 1);
    {
      CommNode node;
      RF_ASSERT_OK(make_comm_node(backend(), rank, n, ex, node));
      EXPECT_EQ(process_cpus(), all);
    }
    setenv("RDMAFLOW_COLL_BIND", "2", 1);
    CommNode node;
    Status st = make_comm_node(backend(), rank, n, ex, node);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("RDMAFLOW_COLL_BIND"), std::string::npos) << st.to_string();
    return 0;
  });
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectivesBind, ::testing::ValuesIn(backend_rows()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace rdmaflow::testing
