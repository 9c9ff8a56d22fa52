#include "bench/e2e/replay_job.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "bench/e2e/job.h"
#include "graph/analyze.h"
#include "graph/cost.h"
#include "graph/pipeline.h"
#include "graph/tools/load_model.h"
#include "graph/training.h"
#include "runtime/session/session.h"

namespace rdmaflow::e2e {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
constexpr const char* kReplay = "replay";

// The pattern word at 8-byte index i of transfer t's payload in `step`.
uint64_t pattern(graph::TransferId t, uint64_t step, uint64_t i) {
  uint64_t x = (uint64_t{t} << 40) ^ (step << 24) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  return x ^ (x >> 29);
}

void fill(void* data, size_t bytes, graph::TransferId t, uint64_t step) {
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t w = pattern(t, step, i / 8);
    std::memcpy(p + i, &w, std::min<size_t>(8, bytes - i));
  }
}

bool matches(const void* data, size_t bytes, graph::TransferId t, uint64_t step) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t w = pattern(t, step, i / 8);
    if (std::memcmp(p + i, &w, std::min<size_t>(8, bytes - i)) != 0) return false;
  }
  return true;
}

// A dynamic tensor's dims in `step`: the unknown dimensions set so that the
// payload is about `bytes` (the first takes the size, the others 1).
std::vector<int64_t> dynamic_dims(const graph::TransferSpec& t, uint64_t bytes) {
  uint64_t known = dtype_size(t.dtype);
  for (int64_t d : t.shape) known *= d >= 0 ? static_cast<uint64_t>(std::max<int64_t>(d, 1)) : 1;
  std::vector<int64_t> dims = t.shape;
  bool first = true;
  for (auto& d : dims) {
    if (d >= 0) continue;
    d = first ? static_cast<int64_t>(std::max<uint64_t>(1, bytes / known)) : 1;
    first = false;
  }
  return dims;
}

uint64_t payload_of(const graph::TransferSpec& t, const std::vector<int64_t>& dims) {
  return graph::static_bytes(t.dtype, dims).value_or(0);
}

// What a transfer carries in `step`: the planned bytes, or for a dynamic one
// a size around the hint (half, the hint, 1.5x in turn when varied).
std::vector<int64_t> dims_in_step(const graph::TransferSpec& t, uint64_t step, bool vary) {
  if (!t.dynamic) return t.shape;
  static constexpr double kScale[] = {0.5, 1.0, 1.5};
  const double scale = vary ? kScale[step % 3] : 1.0;
  return dynamic_dims(t, static_cast<uint64_t>(static_cast<double>(t.bytes) * scale));
}

}  // namespace

Result<json> run_replay(const json& job, Bootstrap& boot) {
  std::map<std::string, int64_t> dims;
  if (job.contains("dims")) dims = job["dims"].get<std::map<std::string, int64_t>>();
  RDMAFLOW_ASSIGN_OR_RETURN(graph::LoadedModel model,
                            graph::load_model(job.at("model").get<std::string>(), dims));
  const int ranks = boot.world_size();
  graph::PlanOptions po;
  po.pipeline_depth = job.value("depth", 2u);
  po.dynamic_size_hint = job.value("dynamic_hint", po.dynamic_size_hint);
  graph::PipelineOptions pipe;
  pipe.dynamic_hint = po.dynamic_size_hint;
  RDMAFLOW_ASSIGN_OR_RETURN(graph::PipelinePartition stages,
                            graph::pipeline_partition(model.file.graph, ranks, pipe));
  graph::TrainingGraph training;
  const bool train = job.value("train", false);
  if (train) {
    RDMAFLOW_ASSIGN_OR_RETURN(
        training, graph::add_backward(model.file.graph, stages.placement, po.dynamic_size_hint));
  }
  const graph::Graph& g = train ? training.graph : model.file.graph;
  const graph::Placement& placement = train ? training.placement : stages.placement;
  RDMAFLOW_ASSIGN_OR_RETURN(graph::TransferPlan plan,
                            graph::plan_transfers(g, placement, ranks, po));
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(plan, boot));

  // Compute stand-ins: each op's estimated FLOPs at `gflops`, by schedule position.
  const double gflops = job.value("gflops", 0.0);
  const graph::RankPlan& rp = s->rank_plan();
  std::vector<std::chrono::nanoseconds> compute(rp.schedule.size());
  if (gflops > 0) {
    const std::vector<double> cost = graph::estimate_costs(g, po.dynamic_size_hint);
    for (size_t i = 0; i < rp.schedule.size(); ++i) {
      if (rp.schedule[i].kind != graph::OpKind::kCompute) continue;
      auto id = g.find_op(rp.schedule[i].name);
      if (id) {
        compute[i] = std::chrono::nanoseconds(static_cast<int64_t>(
            cost[static_cast<size_t>(*id)] / gflops));  // FLOP / (GFLOP/s) = ns
      }
    }
  }

  const int steps = job.value("steps", 10);
  const bool vary = job.value("vary", false);
  std::vector<double> ms;
  uint64_t verified = 0, bytes_sent = 0;
  std::vector<unsigned char> staging;
  for (int step = 0; step < steps; ++step) {
    const auto st = static_cast<uint64_t>(step);
    const auto t0 = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(s->begin_step(st));
    for (size_t i = 0; i < rp.schedule.size(); ++i) {
      const graph::ScheduledOp& op = rp.schedule[i];
      if (op.kind == graph::OpKind::kCompute) {
        if (compute[i].count() > 0) std::this_thread::sleep_for(compute[i]);
        continue;
      }
      const auto t = static_cast<graph::TransferId>(op.transfer);
      const graph::TransferSpec& spec = plan.transfers[t];
      const std::vector<int64_t> d = dims_in_step(spec, st, vary);
      const uint64_t bytes = payload_of(spec, d);
      if (op.kind == graph::OpKind::kSend) {
        RDMAFLOW_ASSIGN_OR_RETURN(auto buf, s->output_buffer(spec.tensor, st, bytes));
        SendSource src;
        src.bytes = bytes;
        if (spec.dynamic) src.dims = d;
        if (buf && buf->capacity >= bytes) {
          fill(buf->data, bytes, t, st);  // the producer writes into registered memory
        } else {
          staging.resize(bytes);  // larger than planned: the session's read path
          fill(staging.data(), bytes, t, st);
          src.data = staging.data();
        }
        RDMAFLOW_RETURN_IF_ERROR(s->send(t, st, src));
        bytes_sent += bytes;
        continue;
      }
      RDMAFLOW_ASSIGN_OR_RETURN(RecvView v, s->recv(t, st));
      if (v.bytes != bytes || !matches(v.data, v.bytes, t, st)) {
        return RDMAFLOW_ERROR(Code::kProtocolError, kReplay, spec.src_rank,
                              "transfer " + std::to_string(t) + " '" + spec.tensor + "' in step " +
                                  std::to_string(st) + ": " + std::to_string(v.bytes) +
                                  " bytes arrived, expected " + std::to_string(bytes) +
                                  (v.bytes == bytes ? " (the bytes differ)" : ""));
      }
      verified += v.bytes;
    }
    RDMAFLOW_RETURN_IF_ERROR(s->end_step(st));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const SessionStats stats = s->stats();
  RDMAFLOW_RETURN_IF_ERROR(s->finish());
  // Every rank's median step time and counts, to rank 0.
  const double med = median_after(ms, std::min<size_t>(3, ms.size() / 2));
  json mine{{"step_ms_median", med},      {"bytes_sent", bytes_sent},
            {"bytes_verified", verified}, {"reads", stats.reads},
            {"writes", stats.writes},     {"staging_copies", stats.staging_copies}};
  const std::string text = mine.dump();
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all,
                            boot.allgather(Bytes(text.begin(), text.end())));
  if (boot.rank() != 0) return json();
  json per_rank = json::array();
  double slowest = 0;
  uint64_t total_sent = 0, total_verified = 0, reads = 0;
  for (const Bytes& b : all) {
    json r = json::parse(std::string(b.begin(), b.end()));
    slowest = std::max(slowest, r["step_ms_median"].get<double>());
    total_sent += r["bytes_sent"].get<uint64_t>();
    total_verified += r["bytes_verified"].get<uint64_t>();
    reads += r["reads"].get<uint64_t>();
    per_rank.push_back(std::move(r));
  }
  if (total_sent != total_verified) {
    return RDMAFLOW_ERROR(Code::kProtocolError, kReplay, -1,
                          std::to_string(total_sent) + " bytes sent but " +
                              std::to_string(total_verified) + " verified on arrival");
  }
  uint64_t planned = 0;
  for (const auto& t : plan.transfers) planned += t.bytes;
  return json{{"transport", s->transport_name()},
              {"model", model.description},
              {"ops", g.num_ops()},
              {"transfers", plan.transfers.size()},
              {"steps", steps},
              {"step_ms_median", slowest},
              {"bytes_per_step", planned},
              {"bytes_sent", total_sent},
              {"bytes_verified", total_verified},
              {"dynamic_reads", reads},
              {"ranks", per_rank}};
}

}  // namespace rdmaflow::e2e
