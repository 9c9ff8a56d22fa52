// p2p: point-to-point latency and bandwidth of each transport, each beside a
// plain-socket reference measured in the same run, between two processes.
//
//   p2p                        # forks its two processes; every available transport
//   p2p --transport tcp --quick --json
//   mpirun -H h0:1,h1:1 -np 2 p2p --json-file p2p.json   # two hosts (docs/cluster.md)
//   p2p --rank R --rendezvous 10.0.0.1:29500             # started by hand on each host
//
// Under a launcher (mpirun, srun) rank 0's out-of-band socket is found the way
// rdmaflow's own launcher rendezvous finds its store
// (runtime/rendezvous/launcher_rendezvous.h): no --rendezvous needed.
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
// loops over TensorFlow-style RecvTensor between the same two hosts, once per
// size before the transports, in a child process of each rank
// (p2p-grpc-reference, over the rank's out-of-band socket) with the malloc
// tunables gRPC's own measurement asks for (unless --default-malloc); every
// transport's table has a gRPC column and its ratio.
//
// Competing load (--load N): N busy processes (plain CPU loops, default nice
// level) run beside the two processes from before the first measurement to
// after the last, so every row and its references are measured under the same
// load; forked, rank 0 starts them, launched, each rank on its host.
//
// Link rate (bench/link_rate.h): plain TCP sockets from rank 0 to rank 1, one
// connection then four, before everything else; the bandwidth tables give each
// row's share of it.
//
// Contenders: tcp; ucx_shm (UCX_TLS=posix,sysv,cma,self); ucx_tcp (UCX_TLS=tcp,self
// on lo); verbs (skipped with its reason where no RDMA device exists); ucx (UCX's
// own choice of transports). Across hosts every backend as it is (tcp, ucx,
// verbs), listening on the address that reaches the peer; the rows pinned to a
// same-host medium are skipped with the reason.
#include "bench/p2p/contender.h"
#include "bench/p2p/harness.h"

#include <fstream>
#include <tuple>

#include "bench/link_rate.h"
#include "runtime/rendezvous/launcher_rendezvous.h"

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

// The two ranks as transport selection sees them: their capability records,
// exchanged, and what RDMAFLOW_TRANSPORT=auto picks for the pair.
struct Pair {
  RankCapabilities rank0, rank1;
  bool decoded = false;
  bool across_hosts = false;
  std::string auto_line;
};

Pair exchange_records(int rank, Oob& oob) {
  Pair p;
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
    p.auto_line = "auto: the peer's capability record is malformed: " + theirs.status().reason();
    return p;
  }
  p.decoded = true;
  p.rank0 = rank == 0 ? probe.record : *theirs;
  p.rank1 = rank == 0 ? *theirs : probe.record;
  p.across_hosts = p.rank0.host_id.empty() || p.rank1.host_id.empty()
                       ? p.rank0.hostname != p.rank1.hostname
                       : p.rank0.host_id != p.rank1.host_id;
  auto d = decide_pair(0, p.rank0, 1, p.rank1);
  p.auto_line = d.is_ok() ? "RDMAFLOW_TRANSPORT=auto picks " + d->transport + " for this pair (" +
                                d->reason + ")"
                          : "RDMAFLOW_TRANSPORT=auto: " + d.status().reason();
  return p;
}

// What a row's data moves over between the two ranks: a pinned row over its
// medium, a backend as it is over what it answers for the pair. A backend that
// would not offer itself for the pair (UCX between hosts without RDMA) still
// runs when named: over its own TCP when it has one.
struct RowMedium {
  Medium medium = Medium::kNone;
  std::string text;
};
RowMedium row_medium(const Spec& spec, const Pair& p) {
  if (spec.pinned) {
    const Medium m = spec.shared_memory ? Medium::kSharedMemory : Medium::kSocket;
    return {m, medium_name(m)};
  }
  const BackendReport* a = p.decoded ? p.rank0.usable(spec.backend) : nullptr;
  const BackendReport* b = p.decoded ? p.rank1.usable(spec.backend) : nullptr;
  if (a == nullptr || b == nullptr) return {Medium::kNone, medium_name(Medium::kNone)};
  const Endpoint e0{0, p.rank0.hostname, &a->caps};
  const Endpoint e1{1, p.rank1.hostname, &b->caps};
  const Reach r = transport_reach(spec.backend, e0, e1, !p.across_hosts);
  if (r.medium != Medium::kNone) return {r.medium, medium_name(r.medium)};
  const auto& c = a->caps.components;
  if (std::find(c.begin(), c.end(), "tcp") != c.end()) {
    return {Medium::kSocket, "socket (" + spec.backend + "'s own TCP; auto would not pick " +
                                 spec.backend + " here: " + r.reason + ")"};
  }
  return {Medium::kNone, "none offered (" + r.reason + ")"};
}

nlohmann::json latency_json(const Row& r) {
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
  return row;
}

nlohmann::json bandwidth_json(const Row& r, double link) {
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
  if (link > 0) row["ratio_link"] = r.value / link;
  return row;
}

void print_tables(const std::string& name, bool memcpy_column, const std::string& header,
                  const std::vector<Row>& lat, const std::vector<Row>& bw, double link,
                  const Options& o) {
  std::printf("%s\n", header.c_str());
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
  std::printf("\nBandwidth, windowed one-sided writes (osu_bw style)");
  if (link > 0) std::printf("; link rate measured in this run: %.0f MB/s", link);
  std::printf("\n%10s %8s %14s %14s %8s", "size", "window", (name + " MB/s").c_str(), "socket MB/s",
              "ratio");
  if (memcpy_column) std::printf(" %14s %8s", "memcpy MB/s", "ratio");
  if (o.grpc) std::printf(" %12s %9s", "gRPC MB/s", "vs gRPC");
  if (link > 0) std::printf(" %8s", "of link");
  std::printf("\n");
  for (auto& r : bw) {
    std::printf("%10s %8zu %14.1f %14.1f %8.2f", human(r.size).c_str(), window_for(r.size), r.value,
                r.reference, r.value / r.reference);
    if (memcpy_column) std::printf(" %14.1f %8.2f", r.memcpy, r.value / r.memcpy);
    if (r.grpc > 0) std::printf(" %12.1f %8.2fx", r.grpc, r.value / r.grpc);
    if (link > 0) std::printf(" %7.0f%%", 100 * r.value / link);
    std::printf("\n");
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Runs p2p-grpc-reference (beside this executable) as a child of this rank
// over the rank's out-of-band socket, both ranks at once; fills the figures and
// returns the malloc the child ran with.
std::string run_grpc_reference(int rank, Oob& oob, const std::string& address,
                               const std::vector<size_t>& lat_sizes,
                               const std::vector<size_t>& bw_sizes, const Options& o,
                               std::map<size_t, double>& lat, std::map<size_t, double>& bw) {
  std::vector<char> self(4096);
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  std::string exe = n > 0 ? std::string(self.data(), static_cast<size_t>(n)) : "";
  exe = exe.substr(0, exe.rfind('/') + 1) + "p2p-grpc-reference";
  auto list = [](const std::vector<size_t>& v) {
    std::string t;
    for (size_t x : v) t += (t.empty() ? "" : ",") + std::to_string(x);
    return t;
  };
  std::vector<std::string> args = {exe,
                                   "--rank",
                                   std::to_string(rank),
                                   "--oob-fd",
                                   std::to_string(oob.fd),
                                   "--address",
                                   address,
                                   "--lat",
                                   list(lat_sizes),
                                   "--bw",
                                   list(bw_sizes),
                                   "--seconds",
                                   std::to_string(o.seconds)};
  if (o.default_malloc) args.push_back("--default-malloc");
  int out[2];
  if (::pipe(out) != 0) die("gRPC reference: pipe failed");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) die("gRPC reference: fork failed");
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "p2p: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t k; (k = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) break;
    text.append(buf, static_cast<size_t>(k));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || j.is_discarded()) {
    die("the gRPC reference (" + exe + ") failed (status " + std::to_string(status) + ")");
  }
  for (auto& [k, v] : j["latency_us"].items()) lat[std::stoull(k)] = v.get<double>();
  for (auto& [k, v] : j["bandwidth_MBps"].items()) bw[std::stoull(k)] = v.get<double>();
  return j.value("malloc", std::string());
}

int run(int rank, Oob& oob, const Options& o) {
  const Pair pair = exchange_records(rank, oob);
  std::vector<Spec> specs;
  if (o.transports.empty()) {
    specs = default_specs(pair.across_hosts);
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
  // This rank's address toward the other: where its gRPC server, its link-rate
  // listener and, across hosts, the socket backends listen.
  const std::string address = own_address(rank, ref.fd, o);
  const std::string reach = pair.across_hosts ? address : std::string();
  const std::string hosts = pair.rank0.hostname + " -> " + pair.rank1.hostname;
  if (rank == 0 && !o.json) {
    std::printf("%s\n", pair.auto_line.c_str());
    std::printf("ranks: 0 on %s, 1 on %s (%s)\n", pair.rank0.hostname.c_str(),
                pair.rank1.hostname.c_str(), pair.across_hosts ? "two hosts" : "one host");
    if (o.load > 0) {
      std::printf("competing load: %d busy process%s %s, for the whole run\n", o.load,
                  o.load == 1 ? "" : "es", o.rank < 0 ? "on this host" : "beside each rank");
    }
  }
  // Forked (both ranks here): rank 0 starts the load once; launched: each rank
  // on its own host.
  std::optional<CpuLoad> load;
  if (o.load > 0 && (o.rank >= 0 || rank == 0)) load.emplace(o.load);

  // The link rate between the two ranks, rank 0 sending (as in the bandwidth loops).
  LinkRate link;
  if (o.link_seconds > 0) {
    auto measured = measure_link_rate(
        rank == 0, address,
        [&oob](const std::string& mine) -> Result<std::string> {
          oob.send(mine);
          return oob.recv();
        },
        o.link_seconds);
    check(measured.status(), "link rate");
    link = *measured;
    if (rank == 0 && !o.json)
      std::printf("link rate measured in this run: %s\n", link.describe().c_str());
  }
  const double link_MBps = link.best_MBps();
  if (rank == 0 && !o.json) std::printf("\n");

  const auto lat_sizes = sizes(o.lat_min, o.lat_max, o.quick);
  const auto bw_sizes = sizes(o.bw_min, o.bw_max, o.quick);
  const size_t max_bytes = std::max(lat_sizes.back(), bw_sizes.back());
  nlohmann::json report = nlohmann::json::array();

  // The gRPC reference, once per size, between the same two hosts: each rank
  // runs it in a child process over this rank's out-of-band socket.
  std::map<size_t, double> grpc_lat, grpc_bw;
  std::string grpc_malloc;
  if (o.grpc)
    grpc_malloc = run_grpc_reference(rank, oob, address, lat_sizes, bw_sizes, o, grpc_lat, grpc_bw);
  auto grpc_at = [](const std::map<size_t, double>& m, size_t s) {
    auto it = m.find(s);
    return it == m.end() ? 0.0 : it->second;
  };

  for (const Spec& spec : specs) {
    const std::string& name = spec.label;
    std::string skip = pair.across_hosts ? same_host_only(spec) : std::string();
    std::unique_ptr<Contender> c;
    if (skip.empty()) c = setup(spec, rank, oob, max_bytes, reach, &skip);
    if (!c) {
      if (rank == 0) {
        report.push_back({{"transport", name}, {"skipped", skip}});
        if (!o.json) std::printf("transport %s: skipped (%s)\n", name.c_str(), skip.c_str());
      }
      continue;
    }
    // The memcpy reference is for rows whose data moves through memory.
    const RowMedium medium = row_medium(spec, pair);
    const bool memcpy_ref = medium.medium == Medium::kSharedMemory;
    std::vector<Row> lat, bw;
    for (size_t s : lat_sizes) {
      Latency r, t;
      if (o.interleave) {
        std::tie(r, t) = interleaved_latency(ref, *c, rank, oob, s, o);
      } else {
        r = ref.latency(rank, oob, s, o);
        t = transport_latency(*c, rank, oob, s, o);
      }
      lat.push_back({s, t.avg_us, r.avg_us, t.p50_us, r.p50_us});
      lat.back().grpc = grpc_at(grpc_lat, s);
    }
    for (size_t s : bw_sizes) {
      double r = ref.bandwidth(rank, oob, s, o);
      double t = transport_bandwidth(*c, rank, oob, s, o);
      bw.push_back({s, t, r});
      bw.back().grpc = grpc_at(grpc_bw, s);
      if (memcpy_ref && rank == 0) bw.back().memcpy = memcpy_bandwidth(s, max_bytes, o);
    }
    oob.send("next");
    oob.recv();
    if (rank != 0) continue;
    const char* busy = std::getenv("RDMAFLOW_TCP_BUSY_POLL");
    nlohmann::json j;
    j["transport"] = name;
    j["medium"] = medium_name(medium.medium);
    if (medium.text != medium_name(medium.medium)) j["medium_note"] = medium.text;
    for (const auto& [k, v] : spec.env) j["env"][k] = v;
    j["wait"] = o.spin ? "spin" : "block";
    j["latency_interleaved"] = o.interleave;
    j["busy_poll_us"] = busy ? std::atoi(busy) : 0;
    for (auto& r : lat) j["latency_us"].push_back(latency_json(r));
    // A row through memory is not bounded by the link; its reference is memcpy.
    const double row_link = memcpy_ref ? 0.0 : link_MBps;
    for (auto& r : bw) j["bandwidth_MBps"].push_back(bandwidth_json(r, row_link));
    report.push_back(j);
    if (o.json) continue;
    std::string env;
    for (const auto& [k, v] : spec.env) env += " " + k + "=" + v;
    const std::string where = o.rank >= 0 ? "2 ranks, " + hosts + ", rank 0 at " + o.host
                                          : std::string("2 processes over loopback");
    print_tables(name, memcpy_ref,
                 "transport: " + name + "  (" + where + "; medium: " + medium.text +
                     "; notify wait: " + (o.spin ? "spin" : "block") +
                     "; RDMAFLOW_TCP_BUSY_POLL=" + (busy ? busy : "0") + env + ")",
                 lat, bw, row_link, o);
  }
  if (rank == 0) {
    nlohmann::json out = {{"auto", pair.auto_line}, {"rows", report}};
    out["hosts"] = {pair.rank0.hostname, pair.rank1.hostname};
    out["across_hosts"] = pair.across_hosts;
    out["load"] = o.load;
    if (o.grpc) out["grpc"]["malloc"] = grpc_malloc;
    if (o.link_seconds > 0) out["link_rate"] = link.to_json();
    if (o.grpc) {
      for (size_t s : lat_sizes)
        out["grpc"]["latency_us"].push_back({{"size", s}, {"avg", grpc_lat[s]}});
      for (size_t s : bw_sizes)
        out["grpc"]["bandwidth_MBps"].push_back({{"size", s}, {"MBps", grpc_bw[s]}});
    }
    if (o.json) std::printf("%s\n", out.dump(2).c_str());
    if (!o.json_file.empty()) {
      std::ofstream f(o.json_file);
      f << out.dump(2) << "\n";
      if (!f) die("cannot write " + o.json_file);
    }
  }
  ::close(ref.fd);
  return 0;
}

// Returns the exit status when the command line says not to run (--help, or a
// bad command line).
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{
      "Point-to-point latency and bandwidth of each transport beside a plain-socket reference,\n"
      "the gRPC reference and the link rate, measured in the same run. Forks its two processes\n"
      "unless started by a launcher (mpirun, srun: rank 0 serves the out-of-band socket where\n"
      "rdmaflow's launcher rendezvous would serve its store) or given --rank and --rendezvous.",
      "p2p"};
  cli::configure(app);
  std::vector<std::string> transports;
  app.add_option("--transport", transports,
                 "tcp, ucx_shm, ucx_tcp, ucx, verbs or all; repeat for several")
      ->allow_extra_args(false)
      ->default_str("all: every backend built in (across hosts: each as it is)");
  app.add_flag("--quick", o.quick,
               "a handful of sizes, 0.05 s each unless --seconds is given; link rate 0.5 s");
  app.add_flag("--json", o.json, "the report as JSON on stdout instead of the tables");
  app.add_option("--json-file", o.json_file,
                 "also write the JSON report to FILE (rank 0 writes it)")
      ->type_name("FILE");
  app.add_flag("--spin", o.spin, "busy-wait for notifies instead of blocking");
  app.add_flag("--interleave", o.interleave,
               "latency: alternate the socket reference's round trips with the transport's in "
               "one loop, so both see the same CPU placement (under --load the scheduler may "
               "put the two ranks on one CPU or on two, for a whole phase: 2 vs 20 us here)");
  bool no_grpc = false;
  app.add_flag("--no-grpc", no_grpc, "skip the gRPC reference");
  app.add_flag("--default-malloc", o.default_malloc,
               "run the gRPC reference with glibc's default malloc instead of the tunables");
  auto* seconds = app.add_option("--seconds", o.seconds, "measuring time per size and contender")
                      ->check(cli::at_least(0.001));
  auto* link_seconds =
      app.add_option("--link-seconds", o.link_seconds,
                     "time of each link-rate measurement (1 stream, then 4); 0 skips it")
          ->check(cli::at_least(0.0));
  cli::add_size(app, "--lat-min", o.lat_min, "smallest latency message");
  cli::add_size(app, "--lat-max", o.lat_max, "largest latency message");
  cli::add_size(app, "--bw-min", o.bw_min, "smallest bandwidth message");
  cli::add_size(app, "--bw-max", o.bw_max, "largest bandwidth message");
  app.add_option("--load", o.load,
                 "start N busy processes (plain CPU loops, default nice level) for the run: "
                 "latency and bandwidth with the CPUs taken, the references under the same load")
      ->check(cli::at_least(0))
      ->type_name("N");
  app.add_option("--rank", o.rank, "this process's rank (0 or 1; others exit at once)")
      ->check(cli::at_least(0))
      ->default_str("the launcher's, else fork both ranks here");
  app.add_option("--rendezvous", o.rendezvous,
                 "HOST:PORT rank 0 listens on (with --rank, or to override the launcher's)");
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  for (const auto& t : transports) {
    if (t != "all") o.transports.push_back(t);
  }
  o.grpc = !no_grpc;
  if (o.quick && seconds->count() == 0) o.seconds = 0.05;
  if (o.quick && link_seconds->count() == 0) o.link_seconds = 0.5;
  if (o.lat_min == 0 || o.bw_min == 0 || o.lat_min > o.lat_max || o.bw_min > o.bw_max) {
    std::fprintf(stderr,
                 "p2p: sizes must be at least 1 byte and each minimum at most its maximum\n");
    return cli::kUsageError;
  }
  if (!o.rendezvous.empty()) o.host = o.rendezvous.substr(0, o.rendezvous.rfind(':'));
  return std::nullopt;
}

// Connects the out-of-band channel of a launched rank (--rank, or the
// launcher's variables). Returns false when this process takes no part (rank > 1).
bool connect_launched(Oob& oob, Options& o) {
  int listen_fd = -1;
  if (o.rendezvous.empty()) {
    if (o.rank >= 0) die("--rank needs --rendezvous HOST:PORT");
    // Where rdmaflow's bootstrap would serve its store (PMIx or Slurm), rank 0
    // serves the out-of-band socket: collective under PMIx, so every rank asks.
    auto info = detect_rank_info();
    check(info.status(), "rank detection");
    if (info->world_size < 2) {
      die("started as a single process (" + info->source +
          "); run 2 ranks under a launcher, or give --rank and --rendezvous");
    }
    auto start = [&](const HostPort& at) -> Result<HostPort> {
      uint16_t bound = 0;
      listen_fd = listen_on(at.host, at.port, &bound);
      return HostPort{at.host, bound};
    };
    std::string why_not;
    auto found = find_launcher_rendezvous(*info, process_env(), start, Millis(60000), &why_not);
    check(found.status(), "launcher rendezvous");
    if (!*found) die("no --rendezvous HOST:PORT and " + why_not);
    o.rank = info->rank;
    o.host = (*found)->address.host;
    o.rendezvous = (*found)->address.to_string();
    if (o.rank > 1) return false;
    if (o.rank == 1) oob.fd = connect_to(o.host, (*found)->address.port, Millis(60000));
  } else {
    if (o.rank < 0) {
      auto info = detect_rank_info();
      check(info.status(), "rank detection");
      o.rank = info->rank;
    }
    if (o.rank > 1) return false;  // only two ranks take part
    size_t colon = o.rendezvous.rfind(':');
    auto port = static_cast<uint16_t>(std::stoul(o.rendezvous.substr(colon + 1)));
    if (o.rank == 0) {
      uint16_t bound = 0;
      listen_fd = listen_on(o.host, port, &bound);
    } else {
      oob.fd = connect_to(o.host, port, Millis(60000));
    }
  }
  if (o.rank == 0) {
    oob.fd = accept_one(listen_fd);
    ::close(listen_fd);
  }
  return true;
}

}  // namespace
}  // namespace rdmaflow::bench

int main(int argc, char** argv) {
  using namespace rdmaflow::bench;
  Options o;
  if (auto exit_code = parse(argc, argv, o)) return *exit_code;
  Oob oob;
  const bool launched = o.rank >= 0 || std::getenv("OMPI_COMM_WORLD_RANK") != nullptr ||
                        std::getenv("PMI_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
                        std::getenv("SLURM_PROCID") != nullptr;
  if (launched) {
    if (!connect_launched(oob, o)) return 0;
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
