// One rank of a job on the simulated hosts that runs allreduces (or, with
// --session, Session steps of a 2-rank ping-pong plan) in a loop
// while the test around it breaks something (tests/cluster/faults_test.sh):
// cuts the link between two hosts, slows it down, or SIGKILLs a rank. It
// bootstraps as cluster_check does (a launcher's variables, or RDMAFLOW_RANK
// and RDMAFLOW_RENDEZVOUS by hand), then prints
//
//   fault_check rank R: running                       (the loop has started)
//   fault_check rank R: ok: K calls of N floats in T ms, the longest C ms
//   fault_check rank R: failed: peer P, K calls, T ms after the last good one: STATUS
//
// and exits 0 (all calls correct), 3 (a call failed: the line says how) or 1
// (setup failed, or a call returned wrong sums).
//
//   fault_check --count 16777216 --calls 1 --timeout-ms 2000    # slow link
//   fault_check --count 262144 --seconds 60 --timeout-ms 3000   # until broken
//   fault_check --session --count 65536 --seconds 60 --timeout-ms 3000   # Session steps
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "graph/analyze.h"
#include "graph/graph_json.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"
#include "runtime/session/session.h"

namespace {

using namespace rdmaflow;
using Clock = std::chrono::steady_clock;

struct Options {
  size_t count = 1 << 18;  // floats per allreduce
  long calls = 0;          // 0: until --seconds pass or a call fails
  double seconds = 60;
  long timeout_ms = 0;    // 0: the communicator's default (RDMAFLOW_TIMEOUT_MS)
  long linger_ms = 2000;  // after a failure, before exiting
  Algorithm algo = Algorithm::kAuto;
  bool session = false;  // Session steps (a ping-pong of `count` floats) instead
};

int rank_for_log = -1;

int fail(const std::string& what) {
  std::printf("fault_check rank %d: setup failed: %s\n", rank_for_log, what.c_str());
  std::fflush(stdout);
  return 1;
}

long ms(Clock::duration d) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// A failed call or step: the line the test reads, then a linger (a survivor
// that left at once could be the failed peer the slower survivors see first,
// rather than the rank that died).
[[noreturn]] void failed(const Options& o, int me, const Status& st, long done,
                         Clock::duration since_good) {
  std::printf("fault_check rank %d: failed: peer %d, %ld %s, %ld ms after the last good one: %s\n",
              me, st.peer(), done, o.session ? "steps" : "calls", ms(since_good),
              st.to_string().c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(Millis(o.linger_ms));
  std::_Exit(3);
}

// Runs `one(i)` (call or step i) until --calls or --seconds, timing each: the
// line the test reads on success, failed() on the first error. `what` names
// the unit ("calls", "steps").
template <typename One>
void run_loop(const Options& o, int me, const char* what, One&& one) {
  std::printf("fault_check rank %d: running\n", me);
  std::fflush(stdout);
  const auto start = Clock::now();
  auto last_good = start;
  Clock::duration longest{};
  long done = 0;
  while ((o.calls == 0 || done < o.calls) &&
         Clock::now() - start < std::chrono::duration<double>(o.seconds)) {
    const auto t0 = Clock::now();
    Status st = one(done);
    const auto t1 = Clock::now();
    if (!st.is_ok()) failed(o, me, st, done, t1 - last_good);
    longest = std::max(longest, t1 - t0);
    last_good = t1;
    ++done;
  }
  std::printf("fault_check rank %d: ok: %ld %s of %zu floats in %ld ms, the longest %ld ms\n", me,
              done, what, o.count, ms(Clock::now() - start), ms(longest));
  std::fflush(stdout);
}

// Rank 0 writes "ping" to rank 1, which answers with "pong": one transfer
// each way per step.
Result<graph::TransferPlan> ping_pong_plan(size_t count) {
  graph::GraphFile f;
  f.graph.name = "fault_check_ping_pong";
  const int64_t n = static_cast<int64_t>(count);
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("ping", DataType::kF32, {n}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("pong", DataType::kF32, {n}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_tensor("done", DataType::kF32, {}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("make_ping", "Produce", {}, {"ping"}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("make_pong", "Echo", {"ping"}, {"pong"}).status());
  RDMAFLOW_RETURN_IF_ERROR(f.graph.add_op("check", "Check", {"pong"}, {"done"}).status());
  f.placement.rank = {0, 1, 0};
  f.placement.device = {"cpu:0", "cpu:0", "cpu:0"};
  return graph::plan_transfers(f.graph, f.placement, 2, {});
}

// Session steps until --calls / --seconds, each rank checking what it got.
int run_session(const Options& o, Bootstrap& b) {
  const int me = b.rank();
  if (b.world_size() != 2) return fail("--session runs on 2 ranks");
  auto plan = ping_pong_plan(o.count);
  if (!plan) return fail(plan.status().to_string());
  SessionOptions so;
  if (o.timeout_ms > 0) so.timeout = Millis(o.timeout_ms);
  auto created = Session::create(*plan, b, so);
  if (!created) return fail(created.status().to_string());
  Session& s = **created;
  const char* mine = me == 0 ? "ping" : "pong";
  const char* theirs = me == 0 ? "pong" : "ping";
  auto step = [&](uint64_t st) -> Status {
    RDMAFLOW_RETURN_IF_ERROR(s.begin_step(st));
    auto send = [&]() -> Status {
      RDMAFLOW_ASSIGN_OR_RETURN(auto buf, s.output_buffer(mine, st, o.count * 4));
      if (buf) std::fill_n(static_cast<float*>(buf->data), o.count, static_cast<float>(st));
      return s.send(mine, 1 - me, st);
    };
    if (me == 0) RDMAFLOW_RETURN_IF_ERROR(send());
    RDMAFLOW_ASSIGN_OR_RETURN(RecvView v, s.recv(theirs, 1 - me, st));
    if (static_cast<const float*>(v.data)[o.count - 1] != static_cast<float>(st)) {
      return RDMAFLOW_ERROR(Code::kInternal, "fault_check", 1 - me,
                            "wrong data at step " + std::to_string(st));
    }
    if (me == 1) RDMAFLOW_RETURN_IF_ERROR(send());
    return s.end_step(st);
  };
  run_loop(o, me, "steps", [&](long i) { return step(static_cast<uint64_t>(i)); });
  if (Status st = s.finish(); !st.is_ok()) failed(o, me, st, 0, Clock::duration{});
  return 0;
}

int run(const Options& o) {
  auto boot = Bootstrap::create();
  if (!boot) return fail(boot.status().to_string());
  Bootstrap& b = **boot;
  const int me = b.rank(), world = b.world_size();
  rank_for_log = me;
  if (o.session) {
    if (int rc = run_session(o, b)) return rc;
    if (Status st = b.finalize(); !st.is_ok()) return fail(st.to_string());
    return 0;
  }
  auto selected = connect_selected_mesh(b, requested_transport());
  if (!selected) return fail(selected.status().to_string());
  CommunicatorSetup setup;
  setup.rank = me;
  setup.world = world;
  setup.channels = selected->channels;
  setup.transports = selected->selection->per_peer();
  CommunicatorOptions co;
  co.measure = false;
  auto created = Communicator::create(std::move(setup), co);
  if (!created) return fail(created.status().to_string());
  Communicator& comm = **created;

  // Rank r contributes r + 1 everywhere: every element sums to world(world+1)/2.
  std::vector<float> in(o.count, static_cast<float>(me + 1)), out(o.count);
  const float expect = static_cast<float>(world * (world + 1) / 2);
  CallOptions call;
  call.algorithm = o.algo;
  if (o.timeout_ms > 0) call.timeout = Millis(o.timeout_ms);
  run_loop(o, me, "calls", [&](long done) -> Status {
    RDMAFLOW_RETURN_IF_ERROR(
        comm.allreduce(in.data(), out.data(), o.count, DataType::kF32, ReduceOp::kSum, call));
    for (size_t i = 0; i < o.count; i += 4093) {
      if (out[i] != expect) {
        std::printf("fault_check rank %d: wrong sum at %zu after %ld calls: %g, expected %g\n", me,
                    i, done, static_cast<double>(out[i]), static_cast<double>(expect));
        std::fflush(stdout);
        std::_Exit(1);
      }
    }
    return Status::ok();
  });
  created->reset();
  if (Status st = b.barrier(); !st.is_ok()) return fail(st.to_string());
  selected->selection->shutdown();
  if (Status st = b.finalize(); !st.is_ok()) return fail(st.to_string());
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: fault_check [--count FLOATS] [--calls K] [--seconds S] [--timeout-ms T] "
               "[--linger-ms L] [--algo ALGORITHM] [--session]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--session") {
      o.session = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--count") {
      o.count = std::strtoull(v, nullptr, 10);
    } else if (a == "--calls") {
      o.calls = std::strtol(v, nullptr, 10);
    } else if (a == "--seconds") {
      o.seconds = std::strtod(v, nullptr);
    } else if (a == "--linger-ms") {
      o.linger_ms = std::strtol(v, nullptr, 10);
    } else if (a == "--timeout-ms") {
      o.timeout_ms = std::strtol(v, nullptr, 10);
    } else if (a == "--algo" && parse_algorithm(v)) {
      o.algo = *parse_algorithm(v);
    } else {
      return usage();
    }
  }
  if (o.count == 0) return usage();
  return run(o);
}
