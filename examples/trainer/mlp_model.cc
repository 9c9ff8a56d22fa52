#include "examples/trainer/mlp_model.h"

#include <functional>
#include <map>

namespace rdmaflow::exec {

namespace {

using graph::Attributes;
using graph::GraphFile;
using graph::Shape;

std::string num(const char* prefix, int i) {
  return prefix + std::to_string(i);
}

// Adds tensors and ops, placing each op on a rank.
class Builder {
 public:
  explicit Builder(GraphFile& f) : f_(f) {}
  Status tensor(const std::string& name, DataType dt, Shape shape) {
    auto r = f_.graph.add_tensor(name, dt, std::move(shape));
    return r.status();
  }
  Status op(const std::string& name, const std::string& type, const std::vector<std::string>& in,
            const std::vector<std::string>& out, int rank, Attributes attrs = {}) {
    auto r = f_.graph.add_op(name, type, in, out, std::move(attrs));
    if (!r) return r.status();
    f_.placement.rank.push_back(rank);
    f_.placement.device.push_back("cpu:0");
    return Status::ok();
  }

 private:
  GraphFile& f_;
};

}  // namespace

std::string mlp_mode_name(MlpMode mode) {
  switch (mode) {
    case MlpMode::kSingle:
      return "single";
    case MlpMode::kParameterServer:
      return "ps";
    case MlpMode::kModelParallel:
      return "mp";
    case MlpMode::kDataParallel:
      return "dp";
  }
  return "?";
}

Result<MlpMode> parse_mlp_mode(const std::string& name) {
  for (MlpMode m : {MlpMode::kSingle, MlpMode::kParameterServer, MlpMode::kModelParallel,
                    MlpMode::kDataParallel}) {
    if (mlp_mode_name(m) == name) return m;
  }
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse mode", -1,
                        "unknown mode '" + name + "' (single, ps, mp, dp)");
}

Result<MlpGraph> build_mlp(const MlpConfig& c, MlpMode mode, int ranks, int servers) {
  const char* op = "build MLP graph";
  const int L = static_cast<int>(c.widths.size()) - 1;
  if (L < 1) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "needs at least one layer");
  for (int64_t w : c.widths) {
    if (w < 1) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "layer widths must be >= 1");
  }
  int workers = 1;  // data shards
  int num_ranks = 1;
  if (mode == MlpMode::kParameterServer) {
    if (servers < 1 || ranks <= servers) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "parameter servers need more ranks (" + std::to_string(ranks) +
                                ") than servers (" + std::to_string(servers) + ")");
    }
    workers = ranks - servers;
    num_ranks = ranks;
  } else if (mode == MlpMode::kModelParallel) {
    if (ranks < 1 || ranks > L) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "model parallelism over " + std::to_string(ranks) +
                                " ranks needs at least " + "as many layers (have " +
                                std::to_string(L) + ")");
    }
    num_ranks = ranks;
  } else if (mode == MlpMode::kDataParallel) {
    if (ranks < 1) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "needs ranks >= 1");
    workers = ranks;
  }
  if (c.batch % workers != 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "batch " + std::to_string(c.batch) + " does not divide among " +
                              std::to_string(workers) + " shards");
  }
  const int64_t shard_batch = c.batch / workers;

  MlpGraph m;
  m.num_ranks = num_ranks;
  GraphFile& f = m.file;
  f.graph.name = "mlp_" + mlp_mode_name(mode);
  Builder b(f);
  const auto F32 = DataType::kF32;

  // Where each layer's variables (and its update) live.
  auto var_rank = [&](int l) {
    if (mode == MlpMode::kParameterServer) return (l - 1) % servers;
    if (mode == MlpMode::kModelParallel) return (l - 1) * num_ranks / L;
    return 0;
  };
  for (int l = 1; l <= L; ++l) {
    const int64_t in = c.widths[static_cast<size_t>(l - 1)], out = c.widths[static_cast<size_t>(l)];
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(num("W", l), F32, {in, out}));
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(num("b", l), F32, {out}));
    RDMAFLOW_RETURN_IF_ERROR(b.op(num("W", l), "Variable", {}, {num("W", l)}, var_rank(l),
                                  {{"init", std::string("glorot")}}));
    RDMAFLOW_RETURN_IF_ERROR(b.op(num("b", l), "Variable", {}, {num("b", l)}, var_rank(l),
                                  {{"init", std::string("zeros")}}));
    m.variables.push_back(num("W", l));
    m.variables.push_back(num("b", l));
  }

  // One replica's forward and backward pass; returns the gradient tensor of
  // every variable, by variable name.
  std::map<std::string, std::vector<std::string>> grads;
  auto replica = [&](const std::string& p, int shard, int num_shards, int worker_rank) -> Status {
    auto rank_of = [&](int l) {
      return mode == MlpMode::kModelParallel ? var_rank(l) : worker_rank;
    };
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(p + "x", F32, {shard_batch, c.widths[0]}));
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(p + "y", DataType::kI32, {shard_batch}));
    RDMAFLOW_RETURN_IF_ERROR(
        b.op(p + "input", "Input", {}, {p + "x", p + "y"}, rank_of(1),
             {{"shard", int64_t{shard}}, {"num_shards", int64_t{num_shards}}}));
    std::string h = p + "x";
    for (int l = 1; l <= L; ++l) {
      const int64_t out = c.widths[static_cast<size_t>(l)];
      const std::string z = p + num("z", l), a = p + num("a", l);
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(z, F32, {shard_batch, out}));
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(a, F32, {shard_batch, out}));
      RDMAFLOW_RETURN_IF_ERROR(b.op(p + num("fc", l), "MatMul", {h, num("W", l)}, {z}, rank_of(l)));
      RDMAFLOW_RETURN_IF_ERROR(
          b.op(p + num("bias", l), "BiasAdd", {z, num("b", l)}, {a}, rank_of(l)));
      if (l < L) {
        RDMAFLOW_RETURN_IF_ERROR(b.tensor(p + num("h", l), F32, {shard_batch, out}));
        RDMAFLOW_RETURN_IF_ERROR(
            b.op(p + num("relu", l), "Relu", {a}, {p + num("h", l)}, rank_of(l)));
        h = p + num("h", l);
      }
    }
    const std::string loss = p + "loss";
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(loss, F32, {}));
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(p + num("g_a", L), F32, {shard_batch, c.widths.back()}));
    RDMAFLOW_RETURN_IF_ERROR(b.op(p + "xent", "SoftmaxCrossEntropy", {p + num("a", L), p + "y"},
                                  {loss, p + num("g_a", L)}, rank_of(L)));
    m.losses.push_back(loss);
    for (int l = L; l >= 1; --l) {
      const int64_t in = c.widths[static_cast<size_t>(l - 1)],
                    out = c.widths[static_cast<size_t>(l)];
      const std::string prev = l == 1 ? p + "x" : p + num("h", l - 1);
      const std::string ga = p + num("g_a", l);
      const std::string gw = p + num("g_W", l), gb = p + num("g_b", l);
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(gw, F32, {in, out}));
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(gb, F32, {out}));
      RDMAFLOW_RETURN_IF_ERROR(b.op(p + num("fc_grad_w", l), "MatMul", {prev, ga}, {gw}, rank_of(l),
                                    {{"transpose_a", true}}));
      RDMAFLOW_RETURN_IF_ERROR(
          b.op(p + num("bias_grad", l), "BiasAddGrad", {ga}, {gb}, rank_of(l)));
      if (l > 1) {
        const std::string gh = p + num("g_h", l - 1);
        RDMAFLOW_RETURN_IF_ERROR(b.tensor(gh, F32, {shard_batch, in}));
        RDMAFLOW_RETURN_IF_ERROR(b.tensor(p + num("g_a", l - 1), F32, {shard_batch, in}));
        RDMAFLOW_RETURN_IF_ERROR(b.op(p + num("fc_grad_x", l), "MatMul", {ga, num("W", l)}, {gh},
                                      rank_of(l), {{"transpose_b", true}}));
        RDMAFLOW_RETURN_IF_ERROR(b.op(p + num("relu_grad", l - 1), "ReluGrad",
                                      {gh, p + num("h", l - 1)}, {p + num("g_a", l - 1)},
                                      rank_of(l - 1)));
      }
      grads[num("W", l)].push_back(gw);
      grads[num("b", l)].push_back(gb);
    }
    return Status::ok();
  };

  if (mode == MlpMode::kParameterServer) {
    for (int w = 0; w < workers; ++w) {
      RDMAFLOW_RETURN_IF_ERROR(replica("w" + std::to_string(w) + "/", w, workers, servers + w));
    }
  } else if (mode == MlpMode::kDataParallel) {
    RDMAFLOW_RETURN_IF_ERROR(replica("", -1, ranks, 0));
  } else {
    RDMAFLOW_RETURN_IF_ERROR(replica("", 0, 1, 0));
  }

  // Updates, next to the variables.
  for (const std::string& v : m.variables) {
    const int l = std::stoi(v.substr(1));
    // A copy: adding tensors below may move the graph's tensors (a reference
    // into them would dangle).
    const auto shape = f.graph.tensor(*f.graph.find_tensor(v)).shape;
    const auto& g = grads[v];
    std::string grad = g.front();
    Attributes sgd{{"learning_rate", c.learning_rate}};
    if (mode == MlpMode::kParameterServer) {
      grad = "sum_g_" + v;
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(grad, F32, shape));
      RDMAFLOW_RETURN_IF_ERROR(b.op("aggregate_" + v, "AddN", g, {grad}, var_rank(l)));
      sgd["scale"] = 1.0 / static_cast<double>(workers);
    } else if (mode == MlpMode::kDataParallel) {
      grad = "avg_g_" + v;
      RDMAFLOW_RETURN_IF_ERROR(b.tensor(grad, F32, shape));
      RDMAFLOW_RETURN_IF_ERROR(
          b.op("allreduce_" + v, "AllReduce", g, {grad}, 0, {{"reduction", std::string("avg")}}));
    }
    RDMAFLOW_RETURN_IF_ERROR(b.tensor(v + "_new", F32, shape));
    RDMAFLOW_RETURN_IF_ERROR(
        b.op("sgd_" + v, "ApplySGD", {v, grad}, {v + "_new"}, var_rank(l), sgd));
  }
  return m;
}

}  // namespace rdmaflow::exec
