// p2p: point-to-point latency and bandwidth of each transport, each beside a
// plain-socket reference measured in the same run, between two processes.
//
//   p2p                        # forks its two processes; every available transport
//   p2p --transport tcp --quick --json
//   mpirun -n 2 p2p --rendezvous 10.0.0.1:29500   # or --rank R with the same flag
//
// Latency (osu_latency style): ping-pong of `size` bytes; each side writes with
// notify into the other's registered buffer and waits for the notify; one-way
// latency is half the round trip. Reference: blocking send()/recv() ping-pong
// on a plain TCP socket (TCP_NODELAY), no framework.
//
// Bandwidth (osu_bw style): windows of `window` writes of `size` bytes into the
// peer's registered buffer, each window waited for (a write completes when its
// data is in the peer's memory). Reference: the same bytes as blocking send()
// calls on a plain TCP socket, the receiver recv()ing them and answering one
// byte per window. For the shared-memory rows a second reference is measured
// in the same run: single-thread memcpy() of the same sizes and windows between
// two buffers of this process (what one core can move at best).
//
// gRPC reference (bench/p2p/grpc_reference.h): the same latency and bandwidth
// loops over TensorFlow-style RecvTensor between the same two processes, once
// per size before the transports, with the malloc tunables gRPC's own
// measurement asks for (p2p re-executes itself with GLIBC_TUNABLES set unless
// --default-malloc); every transport's table has a gRPC column and its ratio.
//
// Contenders: tcp; ucx_shm (UCX_TLS=posix,sysv,cma,self); ucx_tcp (UCX_TLS=tcp,self
// on lo); verbs (skipped with its reason where no RDMA device exists); ucx (UCX's
// own choice of transports).
#include "bench/p2p/contender.h"
#include "bench/p2p/grpc_reference.h"
#include "bench/p2p/harness.h"

namespace rdmaflow::bench {
namespace {

struct Row {
  size_t size;
  double value;
  double reference;
  double value_p50 = 0;
  double reference_p50 = 0;
  double memcpy = 0;  // MB/s of single-thread memcpy (bandwidth rows of shared-memory contenders)
  double grpc = 0;    // the gRPC reference at this size (0: not measured)
};

std::string human(size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

// The address this rank's gRPC server listens on: rank 0's own (--rendezvous),
// rank 1's the one its reference socket to rank 0 left from; loopback when
// both processes were forked here.
std::string own_address(int rank, int ref_fd, const Options& o) {
  if (o.rank < 0) return "127.0.0.1";
  if (rank == 0) return o.host;
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  char text[INET_ADDRSTRLEN] = {};
  if (::getsockname(ref_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text)) == nullptr) {
    die("cannot tell the reference socket's local address");
  }
  return text;
}

int run(int rank, Oob& oob, const Options& o) {
  std::vector<Spec> specs;
  if (o.transports.empty()) {
    specs = default_specs();
  } else {
    for (const auto& n : o.transports) {
      for (auto& s : expand(n)) specs.push_back(std::move(s));
    }
  }
  // Plain-socket reference connection, set up once, to rank 0's host.
  Reference ref;
  if (rank == 0) {
    uint16_t port = 0;
    int lfd = listen_on(o.host, 0, &port);
    oob.send(std::to_string(port));
    ref.fd = accept_one(lfd);
    ::close(lfd);
  } else {
    ref.fd = connect_to(o.host, static_cast<uint16_t>(std::stoul(oob.recv())), Millis(30000));
  }
  nodelay(ref.fd);

  // What RDMAFLOW_TRANSPORT=auto picks for this pair, and why (both records
  // exchanged, so a two-host run reports the real pair).
  std::string auto_line;
  {
    TransportConfig tc;
    tc.rank = rank;
    tc.world_size = 2;
    LocalProbe probe = probe_transports("auto", tc);
    for (auto& t : probe.transports) t->shutdown();
    Bytes mine = probe.record.encode();
    oob.send(std::string(mine.begin(), mine.end()));
    std::string peer = oob.recv();
    auto theirs = RankCapabilities::decode(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(peer.data()), peer.size()));
    if (!theirs.is_ok()) {
      auto_line = "auto: the peer's capability record is malformed: " + theirs.status().reason();
    } else {
      auto d = rank == 0 ? decide_pair(0, probe.record, 1, *theirs)
                         : decide_pair(0, *theirs, 1, probe.record);
      auto_line = d.is_ok() ? "RDMAFLOW_TRANSPORT=auto picks " + d->transport + " for this pair (" +
                                  d->reason + ")"
                            : "RDMAFLOW_TRANSPORT=auto: " + d.status().reason();
    }
    if (rank == 0 && !o.json) std::printf("%s\n\n", auto_line.c_str());
  }

  const auto lat_sizes = sizes(o.lat_min, o.lat_max, o.quick);
  const auto bw_sizes = sizes(o.bw_min, o.bw_max, o.quick);
  const size_t max_bytes = std::max(lat_sizes.back(), bw_sizes.back());
  nlohmann::json report = nlohmann::json::array();

  // The gRPC reference, once per size, between the same two processes.
  std::map<size_t, double> grpc_lat, grpc_bw;
  if (o.grpc) {
    // Never destroyed: tearing down the last gRPC server and channel while the
    // process goes on races gRPC 1.51's own teardown of its callback completion
    // queue (a double free on one of its threads, in about a third of the runs
    // here); the process's exit ends it instead.
    GrpcReference* grpc =
        GrpcReference::connect(rank, oob, own_address(rank, ref.fd, o), max_bytes).release();
    for (size_t s : lat_sizes) grpc_lat[s] = grpc->latency(rank, oob, s, o).avg_us;
    for (size_t s : bw_sizes) grpc_bw[s] = grpc->bandwidth(rank, oob, s, o);
    oob.send("grpc done");
    oob.recv();
  }
  auto grpc_at = [](const std::map<size_t, double>& m, size_t s) {
    auto it = m.find(s);
    return it == m.end() ? 0.0 : it->second;
  };

  for (const Spec& spec : specs) {
    const std::string& name = spec.label;
    std::string skip;
    auto c = setup(spec, rank, oob, max_bytes, &skip);
    if (!c) {
      if (rank == 0) {
        if (o.json) {
          report.push_back({{"transport", name}, {"skipped", skip}});
        } else {
          std::printf("transport %s: skipped (%s)\n", name.c_str(), skip.c_str());
        }
      }
      continue;
    }
    std::vector<Row> lat, bw;
    for (size_t s : lat_sizes) {
      Latency r = ref.latency(rank, oob, s, o);
      Latency t = transport_latency(*c, rank, oob, s, o);
      lat.push_back({s, t.avg_us, r.avg_us, t.p50_us, r.p50_us});
      lat.back().grpc = grpc_at(grpc_lat, s);
    }
    for (size_t s : bw_sizes) {
      double r = ref.bandwidth(rank, oob, s, o);
      double t = transport_bandwidth(*c, rank, oob, s, o);
      bw.push_back({s, t, r});
      bw.back().grpc = grpc_at(grpc_bw, s);
      if (spec.shared_memory && rank == 0) bw.back().memcpy = memcpy_bandwidth(s, max_bytes, o);
    }
    oob.send("next");
    oob.recv();
    if (rank != 0) continue;
    const char* busy = std::getenv("RDMAFLOW_TCP_BUSY_POLL");
    if (o.json) {
      nlohmann::json j;
      j["transport"] = name;
      for (const auto& [k, v] : spec.env) j["env"][k] = v;
      j["wait"] = o.spin ? "spin" : "block";
      j["busy_poll_us"] = busy ? std::atoi(busy) : 0;
      for (auto& r : lat) {
        nlohmann::json row = {{"size", r.size},
                              {"transport", r.value},
                              {"socket", r.reference},
                              {"ratio", r.value / r.reference},
                              {"transport_p50", r.value_p50},
                              {"socket_p50", r.reference_p50},
                              {"ratio_p50", r.value_p50 / r.reference_p50}};
        if (r.grpc > 0) {
          row["grpc"] = r.grpc;
          row["ratio_grpc"] = r.grpc / r.value;  // > 1: faster than gRPC
        }
        j["latency_us"].push_back(row);
      }
      for (auto& r : bw) {
        nlohmann::json row = {{"size", r.size},
                              {"transport", r.value},
                              {"socket", r.reference},
                              {"ratio", r.value / r.reference}};
        if (r.memcpy > 0) {
          row["memcpy"] = r.memcpy;
          row["ratio_memcpy"] = r.value / r.memcpy;
        }
        if (r.grpc > 0) {
          row["grpc"] = r.grpc;
          row["ratio_grpc"] = r.value / r.grpc;
        }
        j["bandwidth_MBps"].push_back(row);
      }
      report.push_back(j);
      continue;
    }
    std::string env;
    for (const auto& [k, v] : spec.env) env += " " + k + "=" + v;
    const std::string where =
        o.rank >= 0 ? "2 ranks, rank 0 at " + o.host : std::string("2 processes over loopback");
    std::printf("transport: %s  (%s; notify wait: %s; RDMAFLOW_TCP_BUSY_POLL=%s%s)\n", name.c_str(),
                where.c_str(), o.spin ? "spin" : "block", busy ? busy : "0", env.c_str());
    std::printf("\nLatency in us, one-way = half round trip (osu_latency style)\n");
    std::printf("%10s %12s %12s %8s   %12s %12s %8s", "size", (name + " avg").c_str(), "socket avg",
                "ratio", (name + " p50").c_str(), "socket p50", "ratio");
    if (o.grpc) std::printf("   %10s %9s", "gRPC avg", "vs gRPC");
    std::printf("\n");
    for (auto& r : lat) {
      std::printf("%10s %12.2f %12.2f %8.2f   %12.2f %12.2f %8.2f", human(r.size).c_str(), r.value,
                  r.reference, r.value / r.reference, r.value_p50, r.reference_p50,
                  r.value_p50 / r.reference_p50);
      if (r.grpc > 0) std::printf("   %10.2f %8.2fx", r.grpc, r.grpc / r.value);
      std::printf("\n");
    }
    std::printf("\nBandwidth, windowed one-sided writes (osu_bw style)\n");
    std::printf("%10s %8s %14s %14s %8s", "size", "window", (name + " MB/s").c_str(), "socket MB/s",
                "ratio");
    if (spec.shared_memory) std::printf(" %14s %8s", "memcpy MB/s", "ratio");
    if (o.grpc) std::printf(" %12s %9s", "gRPC MB/s", "vs gRPC");
    std::printf("\n");
    for (auto& r : bw) {
      std::printf("%10s %8zu %14.1f %14.1f %8.2f", human(r.size).c_str(), window_for(r.size),
                  r.value, r.reference, r.value / r.reference);
      if (spec.shared_memory) std::printf(" %14.1f %8.2f", r.memcpy, r.value / r.memcpy);
      if (r.grpc > 0) std::printf(" %12.1f %8.2fx", r.grpc, r.value / r.grpc);
      std::printf("\n");
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (rank == 0 && o.json) {
    nlohmann::json out = {{"auto", auto_line}, {"rows", report}};
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    out["malloc"] = tunables ? tunables : "glibc default";
    if (o.grpc) {
      for (size_t s : lat_sizes)
        out["grpc"]["latency_us"].push_back({{"size", s}, {"avg", grpc_lat[s]}});
      for (size_t s : bw_sizes)
        out["grpc"]["bandwidth_MBps"].push_back({{"size", s}, {"MBps", grpc_bw[s]}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  }
  ::close(ref.fd);
  return 0;
}

// Returns the exit status when the command line says not to run (--help, or a
// bad command line).
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{
      "Point-to-point latency and bandwidth of each transport beside a plain-socket reference\n"
      "measured in the same run. Forks its two processes unless --rank (or OMPI_COMM_WORLD_RANK /\n"
      "PMI_RANK / PMIX_RANK) is given; then rank 0 listens on the rendezvous port and rank 1\n"
      "connects to it.",
      "p2p"};
  cli::configure(app);
  std::vector<std::string> transports;
  app.add_option("--transport", transports,
                 "tcp, ucx_shm, ucx_tcp, ucx, verbs or all; repeat for several")
      ->allow_extra_args(false)
      ->default_str("all: every backend built in");
  app.add_flag("--quick", o.quick, "a handful of sizes, 0.05 s each unless --seconds is given");
  app.add_flag("--json", o.json, "the report as JSON on stdout");
  app.add_flag("--spin", o.spin, "busy-wait for notifies instead of blocking");
  bool no_grpc = false;
  app.add_flag("--no-grpc", no_grpc, "skip the gRPC reference");
  app.add_flag("--default-malloc", o.default_malloc,
               "run with glibc's default malloc instead of the tunables gRPC is measured with");
  auto* seconds = app.add_option("--seconds", o.seconds, "measuring time per size and contender")
                      ->check(cli::at_least(0.001));
  cli::add_size(app, "--lat-min", o.lat_min, "smallest latency message");
  cli::add_size(app, "--lat-max", o.lat_max, "largest latency message");
  cli::add_size(app, "--bw-min", o.bw_min, "smallest bandwidth message");
  cli::add_size(app, "--bw-max", o.bw_max, "largest bandwidth message");
  app.add_option("--rank", o.rank, "this process's rank (0 or 1; others exit at once)")
      ->check(cli::at_least(0))
      ->default_str("fork both ranks here");
  app.add_option("--rendezvous", o.rendezvous, "HOST:PORT rank 0 listens on (with --rank)");
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  for (const auto& t : transports) {
    if (t != "all") o.transports.push_back(t);
  }
  o.grpc = !no_grpc;
  if (o.quick && seconds->count() == 0) o.seconds = 0.05;
  if (o.lat_min == 0 || o.bw_min == 0 || o.lat_min > o.lat_max || o.bw_min > o.bw_max) {
    std::fprintf(stderr,
                 "p2p: sizes must be at least 1 byte and each minimum at most its maximum\n");
    return cli::kUsageError;
  }
  if (o.rank < 0) {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
      if (const char* r = std::getenv(v); r != nullptr && o.rank < 0) o.rank = std::atoi(r);
    }
  }
  if (!o.rendezvous.empty()) o.host = o.rendezvous.substr(0, o.rendezvous.rfind(':'));
  return std::nullopt;
}

}  // namespace
}  // namespace rdmaflow::bench

int main(int argc, char** argv) {
  using namespace rdmaflow::bench;
  Options o;
  if (auto exit_code = parse(argc, argv, o)) return *exit_code;
  if (!o.default_malloc) ensure_malloc_tunables(argv);
  Oob oob;
  if (o.rank >= 0) {
    if (o.rank > 1) return 0;  // only two ranks take part
    if (o.rendezvous.empty()) die("--rank needs --rendezvous HOST:PORT");
    size_t colon = o.rendezvous.rfind(':');
    std::string host = o.rendezvous.substr(0, colon);
    auto port = static_cast<uint16_t>(std::stoul(o.rendezvous.substr(colon + 1)));
    if (o.rank == 0) {
      uint16_t bound = 0;
      int lfd = listen_on(host, port, &bound);
      oob.fd = accept_one(lfd);
      ::close(lfd);
    } else {
      oob.fd = connect_to(host, port, Millis(60000));
    }
    return run(o.rank, oob, o);
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair failed");
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::close(sv[0]);
    oob.fd = sv[1];
    int rc = run(1, oob, o);
    std::fflush(stdout);
    std::_Exit(rc);
  }
  ::close(sv[1]);
  oob.fd = sv[0];
  int rc = run(0, oob, o);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "p2p: the peer process failed (status %d)\n", status);
    return 1;
  }
  return rc;
}