// Launched by mpirun: every rank bootstraps from Open MPI's own variables (no
// RDMAFLOW_RANK), builds the full TCP mesh and exchanges a message on every channel.
//
//   mpi_mesh_check --launch <mpirun> <np> <this executable>
//     picks a free loopback port and execs
//     mpirun -np <np> --allow-run-as-root --oversubscribe
//            -x RDMAFLOW_RENDEZVOUS=127.0.0.1:<port> <this executable>
//   mpi_mesh_check            (as one rank under mpirun)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/rendezvous/bootstrap.h"
#include "tools/free_port.h"

namespace {

using namespace std::chrono_literals;
using namespace rdmaflow;

int launch(const char* mpirun, const char* np, const char* self) {
  const int port = dev::free_port();
  if (port <= 0) {
    std::fprintf(stderr, "mpi_mesh_check: no free loopback port\n");
    return 1;
  }
  const std::string rendezvous = "RDMAFLOW_RENDEZVOUS=127.0.0.1:" + std::to_string(port);
  // The ranks never call MPI_Init, so no MPI transport (btl/pml) is involved; mpirun
  // only starts the processes and sets OMPI_COMM_WORLD_*.
  std::vector<std::string> args = {
      mpirun, "-np",      np,   "--allow-run-as-root",     "--oversubscribe",
      "-x",   rendezvous, "-x", "RDMAFLOW_LOG_LEVEL=info", self};
  std::vector<char*> argv;
  std::string shown;
  for (auto& a : args) {
    argv.push_back(a.data());
    shown += a + " ";
  }
  argv.push_back(nullptr);
  ::setenv("RDMAFLOW_LOG_LEVEL", "info", 1);
  std::fprintf(stderr, "mpi_mesh_check: %s\n", shown.c_str());
  std::fflush(nullptr);
  ::execv(mpirun, argv.data());
  std::fprintf(stderr, "mpi_mesh_check: cannot exec %s: %s\n", mpirun, std::strerror(errno));
  return 1;
}

#define CHECK_OR_FAIL(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) {                                                \
      std::fprintf(stderr, "mpi_mesh_check rank %d: ", rank_env); \
      std::fprintf(stderr, __VA_ARGS__);                          \
      std::fprintf(stderr, "\n");                                 \
      return 1;                                                   \
    }                                                             \
  } while (0)

int run_rank() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* w = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int rank_env = r ? std::atoi(r) : -1;
  CHECK_OR_FAIL(r && w && lr, "not started by Open MPI's mpirun (no OMPI_COMM_WORLD_*)");
  CHECK_OR_FAIL(std::getenv("RDMAFLOW_RANK") == nullptr, "RDMAFLOW_RANK must not be set here");

  auto boot = Bootstrap::create();
  CHECK_OR_FAIL(boot.is_ok(), "%s", boot.status().to_string().c_str());
  Bootstrap& b = **boot;
  CHECK_OR_FAIL(b.rank() == rank_env, "rank %d, expected %s", b.rank(), r);
  CHECK_OR_FAIL(b.world_size() == std::atoi(w), "world %d, expected %s", b.world_size(), w);
  CHECK_OR_FAIL(b.local_rank() == std::atoi(lr), "local rank %d, expected %s", b.local_rank(), lr);
  CHECK_OR_FAIL(b.rank_info().source.find("Open MPI") != std::string::npos, "source %s",
                b.rank_info().source.c_str());

  auto tcp = make_transport("tcp", b.transport_config());
  CHECK_OR_FAIL(tcp.is_ok(), "%s", tcp.status().to_string().c_str());
  auto mesh = b.connect_mesh(**tcp);
  CHECK_OR_FAIL(mesh.is_ok(), "%s", mesh.status().to_string().c_str());
  const int world = b.world_size(), me = b.rank();
  CompletionGroup sent;
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    (*mesh)[p]->send_message(to_bytes(std::to_string(me) + "->" + std::to_string(p)), sent.add(),
                             10000ms);
  }
  Status st = sent.wait(10000ms);
  CHECK_OR_FAIL(st.is_ok(), "%s", st.to_string().c_str());
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    auto msg = (*mesh)[p]->inbox().recv_message(10000ms);
    CHECK_OR_FAIL(msg.is_ok(), "%s", msg.status().to_string().c_str());
    const std::string expected = std::to_string(p) + "->" + std::to_string(me);
    CHECK_OR_FAIL(as_string(*msg) == expected, "got '%s' from rank %d, expected '%s'",
                  as_string(*msg).c_str(), p, expected.c_str());
  }
  st = b.barrier();
  CHECK_OR_FAIL(st.is_ok(), "%s", st.to_string().c_str());
  (*tcp)->shutdown();
  st = b.finalize();
  CHECK_OR_FAIL(st.is_ok(), "%s", st.to_string().c_str());
  std::printf("mpi_mesh_check: rank %d of %d (%s): %d channels ok\n", me, world,
              b.rank_info().source.c_str(), world - 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--launch") == 0) return launch(argv[2], argv[3], argv[4]);
  return run_rank();
}
