// p2p-grpc-reference: bench/p2p's gRPC reference, run by p2p as a child
// process of each rank over the rank's out-of-band socket (inherited), so that
// gRPC's library never lives in the process that measures the transports: its
// background threads, started with the library, cost p2p's ucx_shm latency
// about 0.4 us at 16 KiB while linked in. Writes the figures as JSON to stdout.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/p2p/grpc_reference.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  using namespace rdmaflow::bench;
  Options o;
  int rank = 0;
  int oob_fd = -1;
  std::string address;
  std::vector<size_t> lat_sizes, bw_sizes;
  CLI::App app{"bench/p2p's gRPC reference; p2p runs it (not meant to be run by hand).",
               "p2p-grpc-reference"};
  rdmaflow::cli::configure(app);
  app.add_option("--rank", rank, "0 or 1")->required();
  app.add_option("--oob-fd", oob_fd, "the rank's out-of-band socket, inherited")->required();
  app.add_option("--address", address, "this rank's address for its gRPC server")->required();
  rdmaflow::cli::add_sizes(app, "--lat", lat_sizes, "latency sizes");
  rdmaflow::cli::add_sizes(app, "--bw", bw_sizes, "bandwidth sizes");
  app.add_option("--seconds", o.seconds, "measuring time per size");
  app.add_flag("--default-malloc", o.default_malloc, "keep glibc's default malloc");
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  if (!o.default_malloc) ensure_malloc_tunables(argv);
  Oob oob;
  oob.fd = oob_fd;
  size_t max_bytes = 1;
  for (size_t s : lat_sizes) max_bytes = std::max(max_bytes, s);
  for (size_t s : bw_sizes) max_bytes = std::max(max_bytes, s);
  auto grpc = GrpcReference::connect(rank, oob, address, max_bytes);
  nlohmann::json out;
  for (size_t s : lat_sizes) {
    out["latency_us"][std::to_string(s)] = grpc->latency(rank, oob, s, o).avg_us;
  }
  for (size_t s : bw_sizes)
    out["bandwidth_MBps"][std::to_string(s)] = grpc->bandwidth(rank, oob, s, o);
  oob.send("grpc done");
  oob.recv();
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  out["malloc"] = tunables ? tunables : "glibc default";
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  // No teardown: destroying the last gRPC server and channel races gRPC 1.51's
  // own teardown of its callback completion queue (a double free on one of its
  // threads, in about a third of the runs here); exiting ends it.
  std::_Exit(0);
}
