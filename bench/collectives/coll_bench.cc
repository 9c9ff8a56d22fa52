// bench/collectives: rdmaflow collectives in the nccl-tests convention, with
// Gloo (TCP transport) and Open MPI run on the same processes, in the same
// run, on the same buffers and sizes, for a reference.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 rdmaflow_coll_bench
//       --op allreduce --type f32 --sizes 8,1M,16M,64M --vs gloo --vs mpi [--json out.json]
//   mpirun --mca plm_rsh_agent "scripts/cluster rsh" --mca pml ob1 --mca btl tcp,self,vader
//       -H h0:2,h1:2 -np 4 rdmaflow_coll_bench --vs gloo --vs mpi     (docs/cluster.md)
//   mpirun -np 2 rdmaflow_coll_bench --sizes 8 --vs socket --load 2  (waits under load)
//   mpirun -np 4 rdmaflow_coll_bench --vs mpi --vs gloo --vs plain  (the plain-socket floor)
//   mpirun -np 2 rdmaflow_coll_bench --sizes 1M,16M,64M --codec all   (gradient codecs)
//
// rdmaflow runs as a user's job does: RDMAFLOW_TRANSPORT=auto unless
// --transport says otherwise (shared memory within a host, the network between),
// its rendezvous at RDMAFLOW_RENDEZVOUS, else on a free loopback port when every
// rank is on one host, else found through the launcher (PMIx). Gloo meets
// through rdmaflow's rendezvous store and listens on the address that reaches
// rank 0's host; Open MPI uses the transports mpirun gave it (--mca btl).
//
// Columns: size (bytes of the largest buffer), count (its elements), type,
// redop, algo (ours, from the cost model or RDMAFLOW_<OP>_ALGO / --algo), then
// (--algo all) one column per algorithm of --op, forced, with a line per size
// naming the fastest and the selector's choice as a multiple of its time (with
// RDMAFLOW_COLL_TUNE, the tuner's trial runs before a size is timed and a
// "# tuner:" line gives each candidate's time in it and the winner); then
// per library: time (us, p50 over iterations of the slowest rank; with
// --rounds, default 5 under --algo all, every column is timed in each of the
// rounds, interleaved, and its time is the median of its rounds' medians:
// sweep.h), algbw and
// busbw (GB/s = 1e9 B/s; busbw = algbw x 2(n-1)/n for allreduce, (n-1)/n for
// reduce_scatter, allgather and alltoall, 1 for broadcast and reduce), #wrong,
// min / p99 time, and the ratio of our busbw to the reference's (for --vs
// socket, a ping-pong between ranks 0 and 1: the ratio of its time to ours;
// --vs plain, an f32 sum allreduce over plain TCP sockets, plain_allreduce.h,
// with a line per size giving its trial of each algorithm).
// --codec adds a column per gradient codec (codec_columns.h): its time, the
// bytes one rank sends per call, its speed-up over the uncompressed column
// and its relative error.
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bench/collectives/check_data.h"
#include "bench/collectives/codec_columns.h"
#include "bench/collectives/gloo_store.h"
#include "bench/collectives/plain_allreduce.h"
#include "bench/collectives/reference_columns.h"
#include "bench/collectives/references.h"
#include "bench/collectives/socket_reference.h"
#include "bench/collectives/socket_ring.h"
#include "bench/collectives/sweep.h"
#include "bench/cpu_load.h"
#include "collectives/algorithms/registry.h"
#include "collectives/communicator.h"
#include "common/counters.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"
#include "tools/cli.h"
#include "tools/free_port.h"
#include "transport/transport.h"

using namespace rdmaflow;
using namespace rdmaflow::bench;  // references.h
using Clock = std::chrono::steady_clock;

namespace {

using bench::Bufs;

struct Args {
  CollectiveKind op = CollectiveKind::kAllreduce;
  DataType type = DataType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  std::vector<size_t> sizes;
  size_t min_bytes = 8, max_bytes = 64u << 20;
  int factor = 2;
  int iters = 0;  // 0: by size
  int warmup = 3;
  int rounds = 0;  // 0: 5 with --algo all, else 1 (sweep.h)
  bool vs_gloo = false, vs_mpi = false, vs_socket = false, vs_plain = false;
  int load = 0;              // busy processes beside the first rank of each host (CpuLoad)
  double socket_ring_s = 0;  // --socket-ring: seconds of the plain-socket ring, 0: none
  std::string json;
  std::string transport;  // empty: RDMAFLOW_TRANSPORT, else auto
  Algorithm algo = Algorithm::kAuto;
  bool all_algos = false;         // --algo all: every algorithm of --op beside the selector's
  std::vector<CodecSpec> codecs;  // --codec: a column each

  bench::DataSpec data() const { return {op, type, redop}; }
};

// The name each accepted spelling of --op, --type, --redop and --algo parses to;
// refused by CLI11 with the option's name when `parse` finds nothing.
template <typename Parse>
CLI::Validator named(const std::string& what, Parse parse) {
  return CLI::Validator(
      [what, parse](std::string& v) -> std::string {
        return parse(v) ? "" : "unknown " + what + " '" + v + "'";
      },
      "", what);
}

// "auto|all|ring|tree|...": the --algo choices, from the algorithm registry.
std::string algo_choices() {
  std::string s(algorithm_name(Algorithm::kAuto));
  s += "|all";
  for (const AlgorithmInfo& info : algorithm_table()) s += "|" + std::string(info.name);
  return s;
}

std::optional<Algorithm> parse_algo_or_all(std::string_view name) {
  if (name == "all") return Algorithm::kAuto;
  return parse_algorithm(name);
}

std::optional<CollectiveKind> parse_op(std::string_view name) {
  for (CollectiveKind c : kAllCollectives) {
    if (collective_name(c) == name) return c;
  }
  return std::nullopt;
}

// Returns the exit status when the command line says not to run (--help, or a
// bad command line).
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "rdmaflow collectives in the nccl-tests convention, with Gloo and Open MPI run on the same\n"
      "processes, buffers and sizes for a reference. Start under mpirun.",
      "rdmaflow_coll_bench"};
  cli::configure(app);
  std::string op = "allreduce", type = "f32", redop = "sum", algo = "auto";
  std::vector<std::string> vs;
  app.add_option("--op", op,
                 "allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall or barrier "
                 "(its sizes only name the rows)")
      ->check(named("collective", parse_op));
  app.add_option("--type", type, "f32, f64, f16, bf16, i32, i64 or u8")
      ->check(named("type", parse_dtype));
  app.add_option("--redop", redop, "sum, prod, min, max or avg")
      ->check(named("reduction", parse_reduce_op));
  cli::add_sizes(app, "--sizes", a.sizes, "the sizes to run (bytes of the largest buffer)")
      ->default_str("--min to --max");
  cli::add_size(app, "-b,--min", a.min_bytes, "smallest size when no --sizes");
  cli::add_size(app, "-e,--max", a.max_bytes, "largest size when no --sizes");
  app.add_option("-f,--factor", a.factor, "each size this many times the previous")
      ->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", a.iters, "timed iterations per size")
      ->check(cli::at_least(0))
      ->default_str("0: by size");
  app.add_option("-w,--warmup", a.warmup, "untimed iterations per size first")
      ->check(cli::at_least(0));
  app.add_option("--rounds", a.rounds,
                 "interleave the columns in this many rounds per size, each column timed for "
                 "its share of --iters in every round; a column's time is the median of its "
                 "rounds' medians")
      ->check(CLI::Range(1, 1000))
      ->default_str("5 with --algo all, else 1");
  app.add_option("--vs", vs,
                 "a reference to run beside rdmaflow: gloo, mpi, socket (a ping-pong between "
                 "ranks 0 and 1) or plain (f32 sum allreduce over plain TCP sockets, recursive "
                 "doubling, Rabenseifner or a pipelined ring, whichever a trial before each "
                 "size finds fastest); repeat for several")
      ->allow_extra_args(false)
      ->check(CLI::IsMember({"gloo", "mpi", "socket", "plain"}))
      ->default_str("none");
  app.add_option("--load", a.load,
                 "N busy processes beside the first rank of each host for the whole run: "
                 "every library and reference under the same competing load")
      ->check(cli::at_least(0));
  app.add_option("--socket-ring", a.socket_ring_s,
                 "first measure what plain TCP sockets move in a ring (every rank sending to the "
                 "next and receiving from the previous at once, 1 MiB blocking writes from a "
                 "thread of their own, about this many seconds): what a flat ring allreduce's "
                 "busbw over TCP is read against on these hosts and cores")
      ->check(CLI::Range(0.0, 60.0))
      ->type_name("SECONDS");
  app.add_option("--json", a.json, "also write every field to FILE")->type_name("FILE");
  app.add_option("--transport", a.transport,
                 "rdmaflow's transport: auto (a transport per peer), ucx or tcp")
      ->default_str("RDMAFLOW_TRANSPORT, else auto");
  app.add_option("--algo", algo,
                 "rdmaflow's algorithm (" + algo_choices() +
                     "); wins over RDMAFLOW_<OP>_ALGO. all: the selector's choice beside every "
                     "algorithm of --op, with the fastest and how far the choice is from it")
      ->check(named("algorithm", parse_algo_or_all));
  std::string codecs;
  app.add_option("--codec", codecs,
                 "gradient codecs to run beside uncompressed rdmaflow (f32 allreduce, "
                 "reduce_scatter, allgather): all, or a comma-separated list such as "
                 "fp16,topk:0.01,onebit (docs/compression.md)")
      ->default_str("none");
  if (auto exit_code = cli::parse(app, argc, argv)) return exit_code;
  if (auto list = bench::parse_codec_list(codecs); !list.is_ok()) {
    std::fprintf(stderr, "rdmaflow_coll_bench: --codec: %s\n", list.status().reason().c_str());
    return cli::kUsageError;
  } else {
    a.codecs = *list;
  }
  a.op = *parse_op(op);
  a.type = *parse_dtype(type);
  a.redop = *parse_reduce_op(redop);
  a.algo = *parse_algo_or_all(algo);
  a.all_algos = algo == "all";
  const bool codec_op = a.op == CollectiveKind::kAllreduce ||
                        a.op == CollectiveKind::kReduceScatter ||
                        a.op == CollectiveKind::kAllgather;
  if (!a.codecs.empty() && (a.type != DataType::kF32 || !codec_op)) {
    std::fprintf(stderr,
                 "rdmaflow_coll_bench: --codec needs --type f32 and --op allreduce, "
                 "reduce_scatter or allgather\n");
    return cli::kUsageError;
  }
  for (const auto& v : vs) {
    if (v == "gloo") a.vs_gloo = true;
    if (v == "mpi") a.vs_mpi = true;
    if (v == "socket") a.vs_socket = true;
    if (v == "plain") a.vs_plain = true;
  }
  if (a.sizes.empty()) {
    if (a.min_bytes == 0 || a.min_bytes > a.max_bytes) {
      std::fprintf(stderr, "rdmaflow_coll_bench: --min must be at least 1 and at most --max\n");
      return cli::kUsageError;
    }
    for (size_t s = a.min_bytes; s <= a.max_bytes; s *= a.factor) a.sizes.push_back(s);
  }
  if (a.rounds == 0) a.rounds = a.all_algos ? 5 : 1;
  return std::nullopt;
}

double busbw_factor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::kAllreduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

bool per_rank(CollectiveKind k) {
  return k == CollectiveKind::kReduceScatter || k == CollectiveKind::kAllgather ||
         k == CollectiveKind::kAlltoall;
}

using Lib = bench::Column<Args>;

void die(const std::string& what) {
  std::fprintf(stderr, "rdmaflow_coll_bench: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI_Init: --help and a bad command line need no MPI runtime.
  Args a;
  if (auto exit_code = parse(argc, argv, a)) return *exit_code;
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  // Where the ranks run, by rank (Open MPI's names of the hosts).
  std::vector<std::string> hosts(world);
  {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> all(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                  MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < world; ++r)
      hosts[r] = &all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME];
  }
  std::optional<bench::CpuLoad> load;
  if (a.load > 0 && std::find(hosts.begin(), hosts.end(), hosts[rank]) - hosts.begin() == rank) {
    load.emplace(a.load);
  }
  const bool one_host =
      std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });

  // rdmaflow: bootstrap, a transport per peer (auto unless --transport), communicator.
  BootstrapOptions bo;
  if (one_host && std::getenv("RDMAFLOW_RENDEZVOUS") == nullptr) {
    // A free port rank 0 picked, so that jobs on one machine never collide.
    int port = rank == 0 ? dev::free_port() : 0;
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    bo.rendezvous = "127.0.0.1:" + std::to_string(port);
  }
  auto boot = Bootstrap::create(bo);
  if (!boot.is_ok()) die(boot.status().to_string());
  const std::string requested = requested_transport(a.transport);
  auto mesh = connect_selected_mesh(**boot, requested);
  if (!mesh.is_ok()) die(mesh.status().to_string());
  TransportSelection& selection = *mesh->selection;
  CommunicatorSetup setup;
  setup.rank = rank;
  setup.world = world;
  setup.channels = mesh->channels;
  setup.transports = selection.per_peer();
  auto t_create = Clock::now();
  auto comm_r = Communicator::create(setup);
  if (!comm_r.is_ok()) die(comm_r.status().to_string());
  const double create_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t_create).count();
  Communicator& comm = **comm_r;

  // Gloo over its TCP transport (it has no other between processes), meeting
  // through rdmaflow's store and listening where rdmaflow's sockets do.
  std::shared_ptr<gloo::rendezvous::Context> gctx;
  std::string gloo_address = "127.0.0.1";
  if (a.vs_gloo) {
    const std::string reach = (*boot)->transport_config().reach_address;
    if (!reach.empty()) gloo_address = reach;
    gloo::transport::tcp::attr attr;
    attr.hostname = gloo_address;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    bench::GlooStore store(std::make_shared<PrefixStore>((*boot)->shared_store(), "gloo"));
    gctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    try {
      gctx->connectFullMesh(store, dev);
    } catch (const std::exception& e) {
      die(std::string("Gloo: ") + e.what());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  std::vector<Lib> libs;
  libs.push_back({"rdmaflow", [](const Args&, size_t) { return true; },
                  [&](const Args& x, size_t count, Bufs& b) {
                    CallOptions o;
                    o.algorithm = x.algo;
                    const size_t c = per_rank(x.op) ? count / world : count;
                    Status st = comm.run(x.op, b.in.data(), b.out.data(), c, x.type, x.redop, 0, o);
                    if (!st.is_ok()) die(st.to_string());
                  },
                  [&](const Args& x, size_t count) {
                    CallOptions o;
                    o.algorithm = x.algo;
                    auto al = comm.select(x.op, per_rank(x.op) ? count / world : count, x.type, o);
                    return al.is_ok() ? std::string(algorithm_name(*al)) : std::string("?");
                  },
                  // The tuner's trial (RDMAFLOW_COLL_TUNE) before the rounds,
                  // untimed: the column times what the selector settled on.
                  // Every rank settles at the same call, so all stop together.
                  [&](const Args& x, size_t count, Bufs& b) {
                    const size_t c = per_rank(x.op) ? count / world : count;
                    if (x.algo != Algorithm::kAuto || !comm.tuning(x.op, c, x.type)) return;
                    for (size_t i = 0; i <= Tuner::kMostTrialCalls && !comm.tuned(x.op, c, x.type);
                         ++i) {
                      Status st = comm.run(x.op, b.in.data(), b.out.data(), c, x.type, x.redop, 0);
                      if (!st.is_ok()) die(st.to_string());
                    }
                  }});
  if (a.all_algos) {
    for (Algorithm algo : algorithms_for(a.op)) {
      const std::string name(algorithm_name(algo));
      libs.push_back({name, [](const Args&, size_t) { return true; },
                      [&comm, algo, world](const Args& x, size_t count, Bufs& b) {
                        CallOptions o;
                        o.algorithm = algo;
                        const size_t c = per_rank(x.op) ? count / world : count;
                        Status st =
                            comm.run(x.op, b.in.data(), b.out.data(), c, x.type, x.redop, 0, o);
                        if (!st.is_ok()) die(st.to_string());
                      },
                      [name](const Args&, size_t) { return name; }});
    }
  }
  const size_t first_reference = libs.size();
  // Codec columns (after the algorithms: note_selector looks only at those).
  std::vector<std::unique_ptr<bench::CodecColumn>> columns;
  for (const CodecSpec& spec : a.codecs) {
    columns.push_back(std::make_unique<bench::CodecColumn>(comm, spec));
    bench::CodecColumn* col = columns.back().get();
    libs.push_back({col->name(), [col](const Args& x, size_t) { return col->supports(x.op); },
                    [col](const Args& x, size_t count, Bufs&) {
                      Status st = col->run(x.op, count, x.redop);
                      if (!st.is_ok()) die(st.to_string());
                    },
                    [spec](const Args&, size_t) { return codec_text(spec); }});
  }
  auto column_of = [&](size_t l) {
    return l >= first_reference && l < first_reference + columns.size()
               ? columns[l - first_reference].get()
               : nullptr;
  };
  if (a.vs_gloo) libs.push_back(bench::gloo_column<Args>(gctx, world));
  if (a.vs_mpi) libs.push_back(bench::mpi_column<Args>(rank, world));
  const size_t es = dtype_size(a.type);
  // Where the plain-socket references listen: the address that reaches this
  // rank's host, as rdmaflow's own sockets do.
  const std::string socket_address = (*boot)->transport_config().reach_address.empty()
                                         ? std::string("127.0.0.1")
                                         : (*boot)->transport_config().reach_address;
  std::optional<bench::SocketPingPong> sock;
  if (a.vs_socket && world > 1) {
    sock.emplace(rank, socket_address);
    libs.push_back(bench::socket_column<Args>(*sock, es));
  }
  std::optional<bench::PlainAllreduce> plain;
  if (a.vs_plain) {
    plain.emplace(rank, world, socket_address);
    libs.push_back(bench::plain_column<Args>(*plain));
  }

  std::optional<bench::SocketRing> ring;
  if (a.socket_ring_s > 0 && world > 1) {
    ring = bench::measure_socket_ring(rank, world, socket_address, a.socket_ring_s);
  }

  nlohmann::json out_json;
  out_json["load"] = a.load;
  if (ring) {
    out_json["socket_ring"] = {{"MBps", ring->MBps}, {"seconds", ring->seconds}};
  }
  out_json["rounds"] = a.rounds;
  out_json["op"] = std::string(collective_name(a.op));
  out_json["type"] = std::string(dtype_name(a.type));
  out_json["redop"] = std::string(reduce_op_name(a.redop));
  out_json["ranks"] = world;
  auto or_default = [](const char* v) {
    return std::string(v != nullptr && *v != '\0' ? v : "Open MPI's default");
  };
  // Open MPI's transports as mpirun gave them (--mca pml / --mca btl).
  const std::string mpi_pml = or_default(std::getenv("OMPI_MCA_pml"));
  const std::string mpi_btl = or_default(std::getenv("OMPI_MCA_btl"));
  out_json["transport"] = requested;
  out_json["transport_chosen"] = selection.name();
  out_json["rank0_peers"] = nlohmann::json::array();
  for (const PeerTransport& p : selection.peers()) {
    if (p.transport.empty()) continue;
    out_json["rank0_peers"].push_back({{"peer", p.peer},
                                       {"host", hosts[p.peer]},
                                       {"transport", p.transport},
                                       {"medium", medium_name(p.medium)},
                                       {"reason", p.reason}});
  }
  out_json["hosts"] = hosts;
  out_json["host_count"] = std::set<std::string>(hosts.begin(), hosts.end()).size();
  if (a.vs_mpi) out_json["mpi"] = {{"pml", mpi_pml}, {"btl", mpi_btl}};
  if (a.vs_gloo) out_json["gloo"] = {{"transport", "tcp"}, {"address", gloo_address}};
  out_json["cost_model"] = comm.cost_model().to_string();
  out_json["host_groups"] = comm.host_groups().describe();
  {
    auto params_json = [](const CostParams& cp) {
      return nlohmann::json{
          {"alpha_s", cp.alpha},           {"beta_s_per_byte", cp.beta},
          {"gamma_s_per_byte", cp.gamma},  {"gamma_cold_s_per_byte", cp.gamma_cold},
          {"cache_bytes", cp.cache_bytes}, {"round_s", cp.round},
          {"piece_bytes", cp.piece_bytes}};
    };
    // Between hosts when the model has two levels (cost_params_within: within a host).
    out_json["cost_params"] = params_json(comm.cost_model().params());
    if (comm.cost_model().two_level()) {
      out_json["cost_params_within"] = params_json(comm.cost_model().within());
    }
  }
  out_json["communicator_create_ms"] = create_ms;
  out_json["direct_peers"] = comm.stats().direct_peers;
  out_json["rows"] = nlohmann::json::array();

  if (rank == 0) {
    std::string layout;
    for (int r = 0; r < world; ++r) layout += (r ? " " : "") + hosts[r];
    std::printf("# rdmaflow_coll_bench: %s, %s, %s, %d ranks on %zu host(s) (%s), transport %s\n",
                std::string(collective_name(a.op)).c_str(), std::string(dtype_name(a.type)).c_str(),
                std::string(reduce_op_name(a.redop)).c_str(), world,
                std::set<std::string>(hosts.begin(), hosts.end()).size(), layout.c_str(),
                requested.c_str());
    for (const PeerTransport& p : selection.peers()) {
      if (p.transport.empty()) continue;
      std::printf("#   rank 0 -> rank %d on %s: %s over %s (%s)\n", p.peer, hosts[p.peer].c_str(),
                  p.transport.c_str(), medium_name(p.medium), p.reason.c_str());
    }
    if (a.vs_mpi) std::printf("# Open MPI: pml %s, btl %s\n", mpi_pml.c_str(), mpi_btl.c_str());
    if (a.vs_gloo) std::printf("# Gloo: its tcp transport on %s\n", gloo_address.c_str());
    if (sock) std::printf("# socket: a TCP ping-pong of the row's size between ranks 0 and 1\n");
    if (plain) {
      std::printf(
          "# plain: f32 sum allreduce over a full mesh of plain TCP sockets, recursive doubling, "
          "Rabenseifner or a pipelined ring, whichever a short trial before the row found "
          "fastest: the floor of what TCP allows on these hosts and cores\n");
    }
    if (ring) {
      std::printf(
          "# socket ring: plain TCP, every rank sending to the next and receiving from the "
          "previous at once: %.0f MB/s per link (the slowest rank's %.2f s), what a flat ring "
          "allreduce over TCP is read against here\n",
          ring->MBps, ring->seconds);
    }
    if (a.load > 0) {
      std::printf("# competing load: %d busy process%s beside the first rank of each host\n",
                  a.load, a.load == 1 ? "" : "es");
    }
    std::printf("# host groups: %s; cost model: %s (communicator created in %.1f ms)\n",
                comm.host_groups().describe().c_str(), comm.cost_model().to_string().c_str(),
                create_ms);
    std::printf("# same-host direct path (RDMAFLOW_COLL_DIRECT): %d of %d peers\n",
                comm.stats().direct_peers, world - 1);
    if (a.rounds > 1) {
      std::printf(
          "# times: the slowest rank's, every column interleaved in %d rounds; time: the median "
          "of the rounds' medians; GB/s = 1e9 B/s\n",
          a.rounds);
    } else {
      std::printf("# times: p50 over iterations of the slowest rank; GB/s = 1e9 B/s\n");
    }
    std::printf("%12s %10s %5s %5s %13s | %10s %8s %8s %6s %9s %9s", "size(B)", "count", "type",
                "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "min(us)", "p99(us)");
    for (size_t l = 1; l < libs.size(); ++l) {
      if (column_of(l) != nullptr) {
        std::printf(" | %16s %10s %7s %8s", libs[l].name.c_str(), "wire(B)", "speedup", "relerr");
      } else {
        std::printf(" | %12s %8s %7s", libs[l].name.c_str(), "busbw", "ratio");
      }
    }
    std::printf("\n");
  }

  for (size_t size : a.sizes) {
    size_t count = std::max<size_t>(1, size / es);
    if (per_rank(a.op)) count = std::max<size_t>(world, count / world * world);
    const size_t bytes = count * es;
    int iters = a.iters;
    if (iters <= 0) {
      iters = static_cast<int>(
          std::clamp<size_t>((size_t{512} << 20) / std::max<size_t>(bytes, 1), 10, 200));
    }
    nlohmann::json row;
    row["size"] = bytes;
    row["count"] = count;
    std::vector<double> busbws(libs.size(), 0);
    std::vector<std::string> line(libs.size());
    std::string codec_cpu;  // rank 0's encode/decode ms per codec column
    std::vector<bool> supported(libs.size());
    for (size_t l = 0; l < libs.size(); ++l) supported[l] = libs[l].supports(a, count);
    std::vector<bench::Samples> samples;
    {
      // One set of buffers for every column: the calls leave the input as it
      // was, and a set per column would not fit at 256 MiB.
      Bufs b;
      bench::fill(a.data(), rank, world, count, b);
      samples = bench::time_interleaved(libs, supported, a, count, b, iters, a.rounds, a.warmup,
                                        rank, std::to_string(bytes) + " B");
    }
    for (size_t l = 0; l < libs.size(); ++l) {
      Lib& lib = libs[l];
      if (!supported[l]) {
        line[l] = "unsupported";
        continue;
      }
      const bench::Samples& s = samples[l];
      // Verify the last result (fill again: in-place users may have changed inputs).
      Bufs v;
      bench::fill(a.data(), rank, world, count, v);
      bench::settle_mpi();
      lib.run(a, count, v);
      bench::CodecColumn* col = column_of(l);
      unsigned long long bad = lib.name == "socket" || col != nullptr
                                   ? 0
                                   : bench::wrong(a.data(), rank, world, count, v);
      double rel_error = 0;
      if (col != nullptr) {
        auto e = col->relative_error(a.op, count, a.redop);
        if (!e.is_ok()) die(e.status().to_string());
        MPI_Reduce(&*e, &rel_error, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      }
      unsigned long long total_bad = 0;
      MPI_Reduce(&bad, &total_bad, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      // Every rank's process CPU time over its timed calls (threads, user and
      // system: a library's progress threads and the kernel's socket work done
      // in its system calls), summed over the ranks, per call.
      double cpu_all = 0;
      MPI_Reduce(&s.cpu_seconds, &cpu_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank != 0) continue;
      const std::vector<double>& slowest = s.slowest;
      const double p50 = s.p50(), mn = bench::pct(slowest, 0.0), p99 = bench::pct(slowest, 0.99);
      const double cpu_busy = s.cpu_busy();
      // What this rank's channels carried per call (common/counters.h): the
      // wire bytes measured, beside the wire(B) column's figure from the sizes.
      const uint64_t sent_per_call = s.sent / static_cast<uint64_t>(std::max(1, s.calls));
      const double algbw = static_cast<double>(bytes) / (p50 * 1e-6) / 1e9;
      const double busbw = algbw * busbw_factor(a.op, world);
      busbws[l] = busbw;
      nlohmann::json j;
      j["algo"] = lib.algo(a, count);
      j["time_us"] = p50;
      j["min_us"] = mn;
      j["p99_us"] = p99;
      j["mean_us"] = std::accumulate(slowest.begin(), slowest.end(), 0.0) /
                     static_cast<double>(slowest.size());
      j["algbw_gbs"] = algbw;
      j["busbw_gbs"] = busbw;
      j["wrong"] = total_bad;
      j["iters"] = s.calls;
      j["rounds_us"] = s.round_p50;                      // each round's median, in round order
      if (cpu_busy >= 0) j["host_cpu_busy"] = cpu_busy;  // rank 0's host, timed iterations
      j["cpu_us_per_call"] = cpu_all / std::max(1, s.calls) * 1e6;  // all ranks' processes
      j["channel_sent_bytes_per_call"] = sent_per_call;  // rank 0; rdmaflow's own calls only
      row[lib.name] = j;
      if (lib.name == "plain") {
        const bench::PlainAllreduce::Trial& tr = plain->trial(count);
        nlohmann::json& trial = row[lib.name]["trial"];
        trial["calls"] = tr.calls;
        for (size_t k = 0; k < tr.us.size(); ++k) {
          trial[std::string(bench::plain_algo_name(bench::kPlainAlgos[k])) + "_us"] = tr.us[k];
        }
      }
      char buf[256];
      if (col != nullptr) {
        const size_t wire = col->sent_bytes(a.op, count);
        const double speedup = p50 > 0 ? row["rdmaflow"]["time_us"].get<double>() / p50 : 0;
        row[lib.name]["wire_bytes_per_rank"] = wire;
        row[lib.name]["speedup_vs_uncompressed"] = speedup;
        row[lib.name]["relative_error"] = rel_error;
        const bench::CodecColumn::CpuCost cost = col->cpu_cost();
        row[lib.name]["encode_ms"] = cost.encode_ms;  // rank 0, one pass over the input
        row[lib.name]["decode_ms"] = cost.decode_ms;
        codec_cpu += " " + col->name().substr(6) + " " + fixed1(cost.encode_ms) + "/" +
                     fixed1(cost.decode_ms);
        std::snprintf(buf, sizeof(buf), " | %16.0f %10zu %6.2fx %8.1e", p50, wire, speedup,
                      rel_error);
      } else if (l == 0) {
        row[lib.name]["wire_bytes_per_rank"] = bench::uncompressed_sent_bytes(a.op, bytes, world);
        std::snprintf(buf, sizeof(buf),
                      "%12zu %10zu %5s %5s %13s | %10.1f %8.3f %8.3f %6llu %9.1f %9.1f", bytes,
                      count, std::string(dtype_name(a.type)).c_str(),
                      std::string(reduce_op_name(a.redop)).c_str(),
                      j["algo"].get<std::string>().c_str(), p50, algbw, busbw, total_bad, mn, p99);
      } else {
        const double ratio = busbw > 0 ? busbws[0] / busbw : 0;
        row[lib.name]["ratio_ours_to_it"] = ratio;
        std::snprintf(buf, sizeof(buf), " | %12.0f %8.3f %6.2fx%s", p50, busbw, ratio,
                      total_bad ? "!" : "");
      }
      line[l] = buf;
    }
    if (rank == 0) {
      for (size_t l = 0; l < libs.size(); ++l) {
        if (line[l] == "unsupported") {
          std::printf(l == 0 ? "%s" : column_of(l) != nullptr ? " | %45s" : " | %30s", "n/a");
        } else {
          std::printf("%s", line[l].c_str());
        }
      }
      std::printf("\n");
      if (row.contains("plain") && row["plain"].contains("trial")) {
        const auto& tr = row["plain"]["trial"];
        std::string times;
        for (bench::PlainAlgo al : bench::kPlainAlgos) {
          const std::string name = bench::plain_algo_name(al);
          times += (times.empty() ? "" : ", ") + name + " " + fixed1(tr[name + "_us"]) + " us";
        }
        std::printf("#   plain: %s in a trial of %d calls each; ran %s\n", times.c_str(),
                    tr["calls"].get<int>(), row["plain"]["algo"].get<std::string>().c_str());
      }
      const size_t per_call = per_rank(a.op) ? count / world : count;
      if (auto t = comm.tuned(a.op, per_call, a.type); t && t->candidates.size() > 1) {
        std::printf("#   tuner: %s\n", Tuner::describe(a.op, *t).c_str());
        nlohmann::json& tj = row["tuner"];
        tj["winner"] = std::string(algorithm_name(t->winner));
        for (size_t c = 0; c < t->candidates.size(); ++c) {
          tj["median_slowest_us"][std::string(algorithm_name(t->candidates[c]))] =
              static_cast<double>(t->nanos[c]) * 1e-3;
        }
      }
      if (a.all_algos) {
        std::vector<std::string> algos;
        for (Algorithm al : algorithms_for(a.op)) algos.emplace_back(algorithm_name(al));
        bench::note_selector(algos, row);
      }
      if (!columns.empty()) {
        std::printf("#   wire bytes per rank and call, uncompressed: %zu (bandwidth-optimal)\n",
                    bench::uncompressed_sent_bytes(a.op, bytes, world));
        std::printf("#   codec CPU, rank 0, one pass over the input, encode/decode ms:%s\n",
                    codec_cpu.c_str());
      }
      std::fflush(stdout);
      out_json["rows"].push_back(row);
    }
  }
  if (rank == 0 && a.all_algos) {
    int sizes = 0, within = 0;
    for (const auto& row : out_json["rows"]) {
      if (!row.contains("selector")) continue;
      ++sizes;
      // The fastest algorithm chosen is within, whatever its own column
      // measured: that gap is one schedule timed twice, the run's noise.
      const auto& sel = row["selector"];
      within += sel["time_vs_fastest"].get<double>() <= 1.1 || sel["chose"] == sel["fastest"];
    }
    std::printf(
        "# the selector's choice was within 10%% of the fastest algorithm at %d of %d sizes\n",
        within, sizes);
  }
  if (rank == 0) {
    const FabricStats st = comm.stats();
    std::printf(
        "# rank 0 fabric: %llu pieces direct, %llu through the channel, %llu doorbell "
        "sleeps%s; %llu received where they go (RDMAFLOW_COLL_LAND_MIN), %llu bytes copied "
        "out of slots that a landing did not take\n",
        static_cast<unsigned long long>(st.direct_pieces),
        static_cast<unsigned long long>(st.notify_pieces),
        static_cast<unsigned long long>(st.doorbell_sleeps),
        st.mixed_wait   ? ", direct and tcp peers waited for in one ppoll"
        : st.mixed_poll ? ", tcp sockets polled beside the direct words"
                        : "",
        static_cast<unsigned long long>(st.landed_pieces),
        static_cast<unsigned long long>(st.landing_copied_bytes));
  }
  if (rank == 0 && !a.json.empty()) {
    std::ofstream f(a.json);
    f << out_json.dump(2) << "\n";
  }
  // Every rank finished every call before anyone closes its channels.
  MPI_Barrier(MPI_COMM_WORLD);
  comm_r->reset();
  selection.shutdown();
  MPI_Finalize();
  return 0;
}
