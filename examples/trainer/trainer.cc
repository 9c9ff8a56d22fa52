#include "examples/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/env.h"
#include "examples/trainer/data_parallel.h"
#include "examples/trainer/synthetic_data.h"
#include "graph/analyze.h"
#include "graph/partition.h"
#include "runtime/session/session_layout.h"

namespace rdmaflow::exec {

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void add_profile(StepProfile& sum, const StepProfile& p) {
  sum.total_ms += p.total_ms;
  sum.compute_ms += p.compute_ms;
  sum.send_ms += p.send_ms;
  sum.recv_ms += p.recv_ms;
  sum.allreduce_ms += p.allreduce_ms;
  sum.session_ms += p.session_ms;
  for (const auto& [k, v] : p.by_type_ms) sum.by_type_ms[k] += v;
}

int64_t attr_int(const graph::Op& op, const char* name, int64_t fallback) {
  auto it = op.attrs.find(name);
  if (it == op.attrs.end()) return fallback;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  return fallback;
}

// Fills Input ops with rows of the synthetic task: shard k of n gets rows
// [k * rows, (k + 1) * rows) of the step's global batch.
ExecutorHooks::Feed make_feed(std::shared_ptr<SyntheticData> data, int rank, int world) {
  return [data, rank, world](const graph::Op& op, uint64_t step, int index,
                             const TensorView& out) -> Status {
    int64_t shard = attr_int(op, "shard", 0);
    if (shard < 0) shard = rank;
    (void)world;
    const int64_t rows = out.dim(0);
    if (index == 0) {
      if (out.dtype != DataType::kF32 || out.rank() != 2 || out.dim(1) != data->features()) {
        return RDMAFLOW_ERROR(
            Code::kInvalidArgument, "feed '" + op.name + "'", -1,
            "features must be f32 [rows, " + std::to_string(data->features()) + "]");
      }
      data->fill_features(step, shard * rows, rows, out.as<float>());
    } else {
      if (out.dtype != DataType::kI32 || out.rank() != 1) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "feed '" + op.name + "'", -1,
                              "labels must be i32 [rows]");
      }
      data->fill_labels(step, shard * rows, rows, out.as<int32_t>());
    }
    return Status::ok();
  };
}

struct RankRun {
  std::unique_ptr<Executor> executor;
  std::vector<std::string> my_losses;
};

// Runs the steps; losses per step are the mean of this rank's loss tensors.
Status run_steps(const TrainConfig& c, Executor& ex, const std::vector<std::string>& losses,
                 TrainReport& report, std::vector<double>& loss_sum) {
  for (int s = 0; s < c.steps; ++s) {
    const auto t0 = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(ex.run_step(static_cast<uint64_t>(s)));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    double sum = 0;
    for (const auto& name : losses) {
      RDMAFLOW_ASSIGN_OR_RETURN(FetchedTensor f, ex.fetched(name));
      sum += f.as_floats().at(0);
    }
    loss_sum.push_back(sum);
    report.step_ms.push_back(ms);
    report.last_profile = ex.last_profile();
    if (s >= c.warmup_steps || c.steps <= c.warmup_steps) {
      add_profile(report.profile_sum, ex.last_profile());
      ++report.profiled_steps;
    }
    if (c.on_step) {
      c.on_step(StepReport{static_cast<uint64_t>(s), ms,
                           losses.empty() ? kNaN : sum / static_cast<double>(losses.size())});
    }
  }
  for (const auto& v : ex.variable_names()) {
    RDMAFLOW_ASSIGN_OR_RETURN(report.variables[v], ex.variable(v));
  }
  return Status::ok();
}

// This rank's loss tensors (those its rank graph holds and produces).
std::vector<std::string> local_losses(const MlpGraph& m, const graph::RankGraph& rg) {
  std::vector<std::string> out;
  for (const auto& l : m.losses) {
    auto t = rg.graph.find_tensor(l);
    if (t && rg.graph.tensor(*t).producer != graph::kNoOp) out.push_back(l);
  }
  return out;
}

}  // namespace

Result<PlannedMlp> plan_mlp(const TrainConfig& c, int ranks) {
  PlannedMlp p;
  RDMAFLOW_ASSIGN_OR_RETURN(p.mlp, build_mlp(c.model, c.mode, ranks, c.servers));
  RDMAFLOW_ASSIGN_OR_RETURN(p.plan, graph::plan_transfers(p.mlp.file.graph, p.mlp.file.placement,
                                                          p.mlp.num_ranks, c.plan));
  return p;
}

Result<TrainReport> train(const TrainConfig& c, Bootstrap& boot, SessionOptions options) {
  const int rank = boot.rank(), world = boot.world_size();
  RDMAFLOW_ASSIGN_OR_RETURN(PlannedMlp p, plan_mlp(c, world));
  RDMAFLOW_ASSIGN_OR_RETURN(
      graph::PartitionedGraph pg,
      graph::partition(p.mlp.file.graph, p.mlp.file.placement, p.mlp.num_ranks));
  const bool replicated = c.mode == MlpMode::kDataParallel;
  const int graph_rank = replicated ? 0 : rank;
  const graph::RankGraph& rg = pg.ranks.at(static_cast<size_t>(graph_rank));

  TrainReport report;
  auto data =
      std::make_shared<SyntheticData>(c.model.widths.front(), c.model.widths.back(), c.seed);
  ExecutorHooks hooks;
  hooks.feed = make_feed(data, rank, world);

  std::unique_ptr<Session> session;
  std::unique_ptr<DataParallel> dp;
  if (!replicated) {
    RDMAFLOW_ASSIGN_OR_RETURN(session, Session::create(p.plan, boot, options));
    report.transport = session->transport_name();
    for (const auto& t : p.plan.transfers) report.job_bytes_per_step += t.bytes;
  } else {
    // Data parallel: no transfers in the graph; gradients meet in allreduce.
    RDMAFLOW_ASSIGN_OR_RETURN(
        dp, connect_data_parallel(boot, options, {c.codec, c.codec_warmup_steps}));
    report.transport = dp->transport_name();
    hooks.allreduce = dp->allreduce_hook();
    uint64_t grad_bytes = 0;
    for (const auto& op : p.mlp.file.graph.ops()) {
      if (op.type == "AllReduce") {
        const auto& t = p.mlp.file.graph.tensor(op.outputs[0]);
        grad_bytes += graph::static_bytes(t.dtype, t.shape).value_or(0);
      }
    }
    report.job_bytes_per_step = grad_bytes * static_cast<uint64_t>(world);
  }

  const auto losses = local_losses(p.mlp, rg);
  ExecutorOptions eo;
  eo.fetches = losses;
  eo.seed = c.seed;
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Executor> ex,
                            Executor::create(rg, p.plan, graph_rank, session.get(), hooks, eo));
  std::vector<double> loss_sum;
  Status run = run_steps(c, *ex, losses, report, loss_sum);
  if (session) {
    Status fin = session->finish();
    report.session = session->stats();
    if (run.is_ok()) run = fin;
  }
  RDMAFLOW_RETURN_IF_ERROR(run);

  // The job's loss curve: every rank's per-step sums and counts.
  ByteWriter w;
  w.u32(static_cast<uint32_t>(losses.size())).u32(static_cast<uint32_t>(loss_sum.size()));
  for (double v : loss_sum) w.raw(&v, sizeof v);
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all, boot.allgather(w.out()));
  std::vector<double> sum(static_cast<size_t>(c.steps), 0.0);
  double count = 0;
  for (const auto& b : all) {
    ByteReader r(b);
    uint32_t n = 0, steps = 0;
    if (!r.u32(n) || !r.u32(steps) || steps != static_cast<uint32_t>(c.steps)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, "gather losses", -1, "malformed record");
    }
    for (uint32_t s = 0; s < steps; ++s) {
      double v = 0;
      if (!r.raw(&v, sizeof v)) {
        return RDMAFLOW_ERROR(Code::kProtocolError, "gather losses", -1, "truncated record");
      }
      sum[s] += v;
    }
    count += n;
  }
  if (replicated) count = static_cast<double>(losses.size()) * world;
  for (double s : sum) report.loss.push_back(count > 0 ? s / count : kNaN);
  return report;
}

Result<TrainReport> train_single(const TrainConfig& config, int ranks) {
  TrainConfig c = config;
  MlpMode mode = c.mode;
  if (mode == MlpMode::kDataParallel) {
    mode = MlpMode::kSingle;  // one replica on the full batch
    ranks = 1;
  }
  RDMAFLOW_ASSIGN_OR_RETURN(MlpGraph m, build_mlp(c.model, mode, ranks, c.servers));
  // Everything on rank 0.
  for (auto& r : m.file.placement.rank) r = 0;
  RDMAFLOW_ASSIGN_OR_RETURN(graph::PartitionedGraph pg,
                            graph::partition(m.file.graph, m.file.placement, 1));
  RDMAFLOW_ASSIGN_OR_RETURN(graph::TransferPlan plan, graph::analyze(pg, c.plan));
  auto data =
      std::make_shared<SyntheticData>(c.model.widths.front(), c.model.widths.back(), c.seed);
  ExecutorHooks hooks;
  hooks.feed = make_feed(data, 0, 1);
  ExecutorOptions eo;
  eo.fetches = m.losses;
  eo.seed = c.seed;
  RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Executor> ex,
                            Executor::create(pg.ranks[0], plan, 0, nullptr, hooks, eo));
  TrainReport report;
  report.transport = "none";
  std::vector<double> loss_sum;
  RDMAFLOW_RETURN_IF_ERROR(run_steps(c, *ex, m.losses, report, loss_sum));
  for (double s : loss_sum) report.loss.push_back(s / static_cast<double>(m.losses.size()));
  return report;
}

}  // namespace rdmaflow::exec
