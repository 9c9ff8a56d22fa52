// Open MPI's own path across the simulated hosts: each rank says where it runs,
// then an MPI_Allreduce whose sum every rank checks. Run by tests/cluster/mpirun_test.sh
// with --mca btl tcp,self,vader, so ranks on different hosts talk over the bridge.
#include <mpi.h>

#include <cstdio>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// This program checks Open MPI itself across the hosts (no rdmaflow code in
// it), and Open MPI leaves allocations behind at MPI_Finalize: leak checking
// would report Open MPI's leaks, not ours.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0";
}
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1, len = 0;
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Get_processor_name(host, &len);
  std::vector<int> in(1 << 16, rank + 1), out(in.size(), 0);
  MPI_Allreduce(in.data(), out.data(), static_cast<int>(in.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  const int want = world * (world + 1) / 2;
  int bad = 0;
  for (int v : out) bad += v != want;
  std::printf("mpi_allreduce_check: rank %d of %d on %s: allreduce %s\n", rank, world, host,
              bad ? "WRONG" : "ok");
  MPI_Finalize();
  return bad ? 1 : 0;
}
