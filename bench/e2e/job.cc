#include "bench/e2e/job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include <unistd.h>

#include "bench/e2e/launch.h"
#include "bench/e2e/replay_job.h"
#include "bench/link_rate.h"
#include "common/log.h"
#include "examples/trainer/trainer.h"
#include "graph/analyze.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/session/session.h"

namespace rdmaflow::e2e {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

json profile_json(const exec::StepProfile& p, double steps) {
  const double n = std::max(1.0, steps);
  json j{{"total_ms", p.total_ms / n},         {"compute_ms", p.compute_ms / n},
         {"send_ms", p.send_ms / n},           {"recv_ms", p.recv_ms / n},
         {"allreduce_ms", p.allreduce_ms / n}, {"session_ms", p.session_ms / n}};
  json by_type = json::object();
  for (const auto& [k, v] : p.by_type_ms) by_type[k] = v / n;
  j["by_type_ms"] = by_type;
  return j;
}

Status write_weights(const std::string& path, const std::map<std::string, std::vector<float>>& w) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& [name, v] : w) {
    const uint64_t n = name.size(), count = v.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(name.data(), static_cast<std::streamsize>(n));
    out.write(reinterpret_cast<const char*>(&count), 8);
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(count * 4));
  }
  if (!out) return RDMAFLOW_ERROR(Code::kInternal, "write weights", -1, "cannot write " + path);
  return Status::ok();
}

exec::TrainConfig train_config(const json& job) {
  exec::TrainConfig c;
  c.model.widths = job.value("widths", std::vector<int64_t>{784, 1024, 10});
  c.model.batch = job.value("batch", int64_t{48});
  c.model.learning_rate = job.value("lr", 0.1);
  c.steps = job.value("steps", 20);
  c.servers = job.value("servers", 1);
  c.seed = job.value("seed", uint64_t{1});
  c.plan.pipeline_depth = job.value("depth", 2u);
  return c;
}

// Rank 0's result, null on the other ranks.
Result<json> run_train(const json& job, Bootstrap& boot) {
  exec::TrainConfig c = train_config(job);
  RDMAFLOW_ASSIGN_OR_RETURN(c.mode, exec::parse_mlp_mode(job.value("mode", "ps")));
  const std::string label = job.value("progress", std::string());
  // The progress line comes from the last rank: a worker, which sees a loss.
  // On a terminal it is rewritten in place; in a log, a line per tenth of the run.
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (boot.rank() == boot.world_size() - 1 && !label.empty()) {
    c.on_step = [label, tty, steps = c.steps](const exec::StepReport& r) {
      const int every = std::max(1, steps / 10);
      if (!tty && (static_cast<int>(r.step) + 1) % every != 0) return;
      std::fprintf(stderr, "%s  %-12s step %3llu/%d  worker loss %7.4f  %8.1f ms/step   %s",
                   tty ? "\r" : "", label.c_str(), static_cast<unsigned long long>(r.step + 1),
                   steps, r.loss, r.step_ms, tty ? "" : "\n");
      std::fflush(stderr);
    };
  }
  // The profile leaves out the same warm-up steps as the median step time.
  c.warmup_steps = 2;
  RDMAFLOW_ASSIGN_OR_RETURN(exec::TrainReport report, exec::train(c, boot));
  if (boot.rank() == 0 && !label.empty()) {
    std::fprintf(stderr, "%s  %-12s done: %d steps, mean loss %.4f, %.1f ms/step (median)   \n",
                 ::isatty(STDERR_FILENO) == 1 ? "\r" : "",
                 (label == report.transport ? label : label + " = " + report.transport).c_str(),
                 c.steps, report.loss.back(), median_after(report.step_ms, 2));
  }
  const double measured = std::max(1, report.profiled_steps);
  json mine{{"rank", boot.rank()},
            {"bytes_sent", report.session.bytes_sent},
            {"bytes_received", report.session.bytes_received},
            {"writes", report.session.writes},
            {"staging_copies", report.session.staging_copies},
            {"credit_wait_ms", report.session.credit_wait_ms / c.steps},
            {"recv_wait_ms", report.session.recv_wait_ms / c.steps},
            {"profile", profile_json(report.profile_sum, measured)}};
  const std::string text = mine.dump();
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all,
                            boot.allgather(std::vector<uint8_t>(text.begin(), text.end())));
  if (boot.rank() != 0) return json();
  json result{{"transport", report.transport},
              {"loss", report.loss},
              {"step_ms", report.step_ms},
              {"step_ms_median", median_after(report.step_ms, 2)},
              {"plan_bytes_per_step", report.job_bytes_per_step}};
  double sent = 0;
  json ranks = json::array();
  for (const auto& b : all) {
    json r = json::parse(std::string(b.begin(), b.end()), nullptr, false);
    sent += r.value("bytes_sent", 0.0);
    ranks.push_back(std::move(r));
  }
  result["bytes_per_step"] = sent / c.steps;
  result["ranks"] = ranks;
  if (job.contains("weights_out")) {
    RDMAFLOW_RETURN_IF_ERROR(
        write_weights(job["weights_out"].get<std::string>(), report.variables));
  }
  return result;
}

Result<json> run_transfer(const json& job, Bootstrap& boot) {
  const uint64_t bytes = job.value("bytes", uint64_t{16} << 20);
  const int steps = job.value("steps", 30);
  graph::GraphFile f;
  f.graph.name = "transfer";
  auto place = [&](int r) {
    f.placement.rank.push_back(r);
    f.placement.device.push_back("cpu:0");
  };
  (void)f.graph.add_tensor("t", DataType::kF32, {static_cast<int64_t>(bytes / 4)});
  (void)f.graph.add_tensor("ack", DataType::kF32, {16});
  (void)f.graph.add_tensor("end", DataType::kF32, {});
  (void)f.graph.add_op("produce", "Produce", {}, {"t"});
  place(0);
  (void)f.graph.add_op("consume", "Consume", {"t"}, {"ack"});
  place(1);
  (void)f.graph.add_op("finish", "Consume", {"ack"}, {"end"});
  place(0);
  graph::PlanOptions po;
  po.pipeline_depth = job.value("depth", 2u);
  RDMAFLOW_ASSIGN_OR_RETURN(graph::TransferPlan plan,
                            graph::plan_transfers(f.graph, f.placement, boot.world_size(), po));
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(plan, boot));
  std::vector<double> ms;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    const auto st = static_cast<uint64_t>(step);
    RDMAFLOW_RETURN_IF_ERROR(s->begin_step(st));
    if (boot.rank() == 0) {
      RDMAFLOW_ASSIGN_OR_RETURN(auto buf, s->output_buffer("t", st, bytes));
      if (step < 2) std::memset(buf->data, step + 1, bytes);  // touch every page once
      RDMAFLOW_RETURN_IF_ERROR(s->send("t", 1, st));
      RDMAFLOW_RETURN_IF_ERROR(s->recv("ack", 1, st).status());
    } else {
      RDMAFLOW_ASSIGN_OR_RETURN(RecvView v, s->recv("t", 0, st));
      RDMAFLOW_ASSIGN_OR_RETURN(auto buf, s->output_buffer("ack", st, 64));
      std::memcpy(buf->data, v.data, 64);
      RDMAFLOW_RETURN_IF_ERROR(s->send("ack", 0, st));
    }
    RDMAFLOW_RETURN_IF_ERROR(s->end_step(st));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  RDMAFLOW_RETURN_IF_ERROR(s->finish());
  if (boot.rank() != 0) return json();
  const double med = median_after(ms, 3);
  return json{{"transport", s->transport_name()},
              {"bytes", bytes},
              {"step_ms", ms},
              {"step_ms_median", med},
              {"gbytes_per_s", static_cast<double>(bytes) / (med * 1e6)}};
}

// The link rate between ranks 0 and 1 (bench/link_rate.h), rank 0 sending.
Result<json> run_link(const json& job, Bootstrap& boot) {
  if (boot.world_size() != 2) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "measure the link rate", -1,
                          "needs 2 ranks, the job has " + std::to_string(boot.world_size()));
  }
  std::string address = boot.transport_config().reach_address;
  if (address.empty()) address = "127.0.0.1";
  auto exchange = [&boot](const std::string& mine) -> Result<std::string> {
    RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all,
                              boot.allgather(Bytes(mine.begin(), mine.end())));
    const Bytes& theirs = all.at(static_cast<size_t>(1 - boot.rank()));
    return std::string(theirs.begin(), theirs.end());
  };
  RDMAFLOW_ASSIGN_OR_RETURN(
      bench::LinkRate rate,
      bench::measure_link_rate(boot.rank() == 0, address, exchange, job.value("seconds", 2.0),
                               job.value("streams", 4)));
  if (boot.rank() != 0) return json();
  return rate.to_json();
}

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

double median_after(const std::vector<double>& v, size_t skip) {
  std::vector<double> w(
      v.begin() + static_cast<ptrdiff_t>(std::min(skip, v.size() > 1 ? v.size() - 1 : 0)), v.end());
  if (w.empty()) return 0;
  std::sort(w.begin(), w.end());
  return w[w.size() / 2];
}

Result<std::map<std::string, std::vector<float>>> read_weights(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::map<std::string, std::vector<float>> w;
  for (;;) {
    uint64_t n = 0, count = 0;
    if (!in.read(reinterpret_cast<char*>(&n), 8)) break;
    std::string name(n, '\0');
    in.read(name.data(), static_cast<std::streamsize>(n));
    in.read(reinterpret_cast<char*>(&count), 8);
    std::vector<float> v(count);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * 4));
    if (!in) return RDMAFLOW_ERROR(Code::kProtocolError, "read weights", -1, "truncated " + path);
    w[name] = std::move(v);
  }
  return w;
}

namespace {

Status run_job(const json& job, Bootstrap& boot) {
  // Where every rank runs, for the result (and the launcher's link bound).
  const std::string me = hostname();
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> names, boot.allgather(Bytes(me.begin(), me.end())));
  const std::string kind = job.value("kind", std::string("train"));
  Result<json> result = json();
  if (kind == "train") {
    result = run_train(job, boot);
  } else if (kind == "transfer") {
    result = run_transfer(job, boot);
  } else if (kind == "link") {
    result = run_link(job, boot);
  } else if (kind == "replay") {
    result = run_replay(job, boot);
  } else {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "run job", -1, "unknown kind " + kind);
  }
  if (!result.is_ok() || boot.rank() != 0) return result.status();
  json hosts = json::array();
  for (const Bytes& n : names) hosts.push_back(std::string(n.begin(), n.end()));
  (*result)["hosts"] = hosts;
  return write_result(*result);
}

}  // namespace

Result<std::vector<PairTraffic>> job_traffic(const json& job, int ranks) {
  const std::string kind = job.value("kind", std::string("train"));
  if (kind == "transfer") {
    return std::vector<PairTraffic>{{0, 1, job.value("bytes", uint64_t{16} << 20)}, {1, 0, 64}};
  }
  if (kind != "train") return std::vector<PairTraffic>{};
  exec::TrainConfig c = train_config(job);
  RDMAFLOW_ASSIGN_OR_RETURN(c.mode, exec::parse_mlp_mode(job.value("mode", "ps")));
  RDMAFLOW_ASSIGN_OR_RETURN(exec::PlannedMlp p, exec::plan_mlp(c, ranks));
  std::vector<PairTraffic> out;
  for (const auto& t : p.plan.transfers) out.push_back({t.src_rank, t.dst_rank, t.bytes});
  return out;
}

uint64_t busiest_link_bytes(const std::vector<PairTraffic>& traffic,
                            const std::vector<std::string>& hosts) {
  std::map<std::string, uint64_t> out, in;
  for (const PairTraffic& t : traffic) {
    const auto src = static_cast<size_t>(t.src), dst = static_cast<size_t>(t.dst);
    if (src >= hosts.size() || dst >= hosts.size() || hosts[src] == hosts[dst]) continue;
    out[hosts[src]] += t.bytes;
    in[hosts[dst]] += t.bytes;
  }
  uint64_t busiest = 0;
  for (const auto& m : {out, in}) {
    for (const auto& [host, bytes] : m) busiest = std::max(busiest, bytes);
  }
  return busiest;
}

int worker_main() {
  auto job = worker_job();
  Status st = job.status();
  if (st.is_ok()) {
    auto boot = Bootstrap::create();
    st = boot.status();
    if (st.is_ok()) st = run_job(*job, **boot);
  }
  if (!st.is_ok()) {
    std::fprintf(stderr, "\nrdmaflow e2e worker (rank %s): %s\n",
                 std::getenv("RDMAFLOW_RANK") ? std::getenv("RDMAFLOW_RANK") : "?",
                 st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace rdmaflow::e2e
