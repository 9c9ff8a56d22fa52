// p2p-session: one-way latency of a Session step beside the plain-socket
// ping-pong of bench/p2p, both measured between the same two forked processes
// in the same run.
//
//   p2p-session                                  # tcp and ucx, 8 B
//   p2p-session --transport ucx --size 1K --load 2
//
// A step is what an executor does with a planned static transfer each way
// (docs/session.md): begin_step, rank 0 writes "ping" into its output buffer
// and sends it, rank 1 receives it and sends "pong" back, rank 0 receives it,
// end_step (which credits the peer). One-way latency is half of rank 0's step
// time, as bench/p2p halves its round trips; the reference is bench/p2p's
// blocking send()/recv() ping-pong on a TCP socket (TCP_NODELAY). The step
// moves more than the socket does (a credit each way per step, and on tcp the
// acknowledgement of every write), so the ratio is the whole cost of the
// session's protocol and waits, not of a wait alone. --load N starts N busy
// processes for the whole run, as bench/p2p --load does.
#include <cmath>

#include "bench/local_pair.h"
#include "bench/p2p/harness.h"
#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/session/session.h"
#include "tools/free_port.h"

namespace rdmaflow::bench {
namespace {

// Rank 0 makes "ping" (f32 [n]), rank 1 echoes it as "pong", rank 0 reads that.
Result<graph::TransferPlan> ping_pong_plan(int64_t n) {
  graph::GraphFile f;
  f.graph.name = "p2p_session_ping_pong";
  auto place = [&](int r) {
    f.placement.rank.push_back(r);
    f.placement.device.push_back("cpu:0");
  };
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("ping", DataType::kF32, {n}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("pong", DataType::kF32, {n}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("done", DataType::kF32, {}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("make_ping", "Produce", {}, {"ping"}).status());
  place(0);
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("make_pong", "Echo", {"ping"}, {"pong"}).status());
  place(1);
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("check", "Check", {"pong"}, {"done"}).status());
  place(0);
  graph::PlanOptions po;
  po.pipeline_depth = 2;
  return graph::plan_transfers(f.graph, f.placement, 2, po);
}

Status step(Session& s, int rank, uint64_t i, size_t bytes) {
  RDMAFLOW_RETURN_IF_ERROR(s.begin_step(i));
  const char* out = rank == 0 ? "ping" : "pong";
  const char* in = rank == 0 ? "pong" : "ping";
  if (rank == 1) RDMAFLOW_RETURN_IF_ERROR(s.recv(in, 0, i).status());
  RDMAFLOW_RETURN_IF_ERROR(s.output_buffer(out, i, bytes).status());
  RDMAFLOW_RETURN_IF_ERROR(s.send(out, 1 - rank, i));
  if (rank == 0) RDMAFLOW_RETURN_IF_ERROR(s.recv(in, 1, i).status());
  return s.end_step(i);
}

struct Row {
  std::string transport;
  Latency session, socket;
  std::string skipped;
};

int run(int rank, Oob& oob, const Options& o, size_t size) {
  Reference ref;
  if (rank == 0) {
    uint16_t port = 0;
    int lfd = listen_on("127.0.0.1", 0, &port);
    oob.send(std::to_string(port));
    ref.fd = accept_one(lfd);
    ::close(lfd);
  } else {
    ref.fd = connect_to("127.0.0.1", static_cast<uint16_t>(std::stoul(oob.recv())), Millis(30000));
  }
  nodelay(ref.fd);
  const auto elems = static_cast<int64_t>(std::max<size_t>(1, (size + 3) / 4));
  const size_t bytes = static_cast<size_t>(elems) * 4;
  auto plan = ping_pong_plan(elems);
  check(plan.status(), "plan");
  std::vector<Row> rows;
  for (const std::string& t : o.transports) {
    Row row;
    row.transport = t;
    // Rank 0's bootstrap serves the store on a port it picks.
    const std::string port = rank == 0 ? std::to_string(dev::free_port()) : std::string();
    if (rank == 0) oob.send(port);
    BootstrapOptions bo =
        bench::local_pair(rank, "p2p-session", "127.0.0.1:" + (rank == 0 ? port : oob.recv()));
    auto boot = Bootstrap::create(bo);
    check(boot.status(), "bootstrap");
    SessionOptions so;
    so.transport = t;
    auto s = Session::create(*plan, **boot, so);
    if (!s.is_ok()) {
      row.skipped = s.status().to_string();
      rows.push_back(row);
      continue;
    }
    uint64_t i = 0;
    row.socket = ref.latency(rank, oob, size, o);
    row.session =
        measure_pingpong(rank, oob, o, size, [&] { check(step(**s, rank, i++, bytes), "step"); });
    check((*s)->finish(), "finish session");
    rows.push_back(row);
  }
  ::close(ref.fd);
  if (rank != 0) return 0;
  std::printf("Session step latency in us, one-way = half a step (%zu B each way)\n", bytes);
  std::printf("%10s %12s %12s %8s   %12s %12s %8s\n", "transport", "session avg", "socket avg",
              "ratio", "session p50", "socket p50", "ratio");
  for (const Row& r : rows) {
    if (!r.skipped.empty()) {
      std::printf("%10s skipped: %s\n", r.transport.c_str(), r.skipped.c_str());
      continue;
    }
    std::printf("%10s %12.2f %12.2f %8.2f   %12.2f %12.2f %8.2f\n", r.transport.c_str(),
                r.session.avg_us, r.socket.avg_us, r.session.avg_us / r.socket.avg_us,
                r.session.p50_us, r.socket.p50_us, r.session.p50_us / r.socket.p50_us);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace rdmaflow::bench

int main(int argc, char** argv) {
  using namespace rdmaflow::bench;
  Options o;
  size_t size = 8;
  CLI::App app{
      "One-way latency of a Session step beside a plain-socket ping-pong, measured\n"
      "between two forked processes in the same run.",
      "p2p-session"};
  rdmaflow::cli::configure(app);
  app.add_option("--transport", o.transports, "tcp, ucx, ...; repeat for several")
      ->default_str("tcp and ucx");
  rdmaflow::cli::add_size(app, "--size", size, "bytes of each transfer (whole f32 elements)");
  app.add_option("--seconds", o.seconds, "measuring time per contender")
      ->check(rdmaflow::cli::at_least(0.001));
  app.add_option("--load", o.load,
                 "start N busy processes (plain CPU loops, default nice level) for the run")
      ->check(rdmaflow::cli::at_least(0))
      ->type_name("N");
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  if (o.transports.empty()) o.transports = {"tcp", "ucx"};
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair failed");
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::close(sv[0]);
    Oob oob{sv[1]};
    const int rc = run(1, oob, o, size);
    std::fflush(stdout);
    std::_Exit(rc);
  }
  ::close(sv[1]);
  std::optional<CpuLoad> load;
  if (o.load > 0) {
    std::printf("competing load: %d busy process%s on this host, for the whole run\n", o.load,
                o.load == 1 ? "" : "es");
    load.emplace(o.load);
  }
  Oob oob{sv[0]};
  const int rc = run(0, oob, o, size);
  load.reset();
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "p2p-session: the peer process failed (status %d)\n", status);
    return 1;
  }
  return rc;
}
