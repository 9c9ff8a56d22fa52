#include "graph/synthetic.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace rdmaflow::graph::synthetic {

namespace {

// Builder shorthand for generators, whose inputs are known to be valid.
class Builder {
 public:
  explicit Builder(std::string name) { f_.graph.name = std::move(name); }

  void tensor(const std::string& name, DataType dt, Shape shape, uint64_t hint = 0) {
    (void)f_.graph.add_tensor(name, dt, std::move(shape), hint);
  }
  void op(const std::string& name, const std::string& type, const std::vector<std::string>& in,
          const std::vector<std::string>& out, int rank, const std::string& device = "cpu:0",
          Attributes attrs = {}) {
    auto id = f_.graph.add_op(name, type, in, out, std::move(attrs));
    if (!id) return;
    f_.placement.rank.push_back(rank);
    f_.placement.device.push_back(device);
  }
  GraphFile take() { return std::move(f_); }

 private:
  GraphFile f_;
};

std::string s(const char* prefix, int i) {
  return prefix + std::to_string(i);
}

}  // namespace

GraphFile mlp_model_parallel(int layers, int ranks, int64_t batch, int64_t hidden) {
  Builder b("mlp_model_parallel");
  auto rank_of_layer = [&](int i) { return (i - 1) * ranks / layers; };
  auto gpu = [](int r) { return "gpu:" + std::to_string(r % 2); };
  b.tensor("x", DataType::kF32, {batch, hidden});
  b.tensor("labels", DataType::kI32, {batch});
  b.op("input", "Input", {}, {"x"}, 0, gpu(0));
  b.op("labels_input", "Input", {}, {"labels"}, ranks - 1, gpu(ranks - 1));
  for (int i = 1; i <= layers; ++i) {
    const int r = rank_of_layer(i);
    const std::string prev = i == 1 ? "x" : s("h", i - 1);
    b.tensor(s("w", i), DataType::kF32, {hidden, hidden});
    b.tensor(s("z", i), DataType::kF32, {batch, hidden});
    b.tensor(s("h", i), DataType::kF32, {batch, hidden});
    b.op(s("weights", i), "Variable", {}, {s("w", i)}, r, gpu(r));
    b.op(s("fc", i), "MatMul", {prev, s("w", i)}, {s("z", i)}, r, gpu(r));
    b.op(s("relu", i), "Relu", {s("z", i)}, {s("h", i)}, r, gpu(r));
  }
  const int last = rank_of_layer(layers);
  b.tensor("loss", DataType::kF32, {});
  b.tensor(s("g_h", layers), DataType::kF32, {batch, hidden});
  b.op("loss", "SoftmaxCrossEntropy", {s("h", layers), "labels"}, {"loss", s("g_h", layers)}, last,
       gpu(last));
  for (int i = layers; i >= 1; --i) {
    const int r = rank_of_layer(i);
    const std::string prev = i == 1 ? "x" : s("h", i - 1);
    b.tensor(s("g_z", i), DataType::kF32, {batch, hidden});
    b.tensor(s("g_w", i), DataType::kF32, {hidden, hidden});
    b.tensor(s("w_new", i), DataType::kF32, {hidden, hidden});
    b.op(s("relu_grad", i), "ReluGrad", {s("g_h", i), s("h", i)}, {s("g_z", i)}, r, gpu(r));
    if (i > 1) {
      b.tensor(s("g_h", i - 1), DataType::kF32, {batch, hidden});
      b.op(s("fc_grad_x", i), "MatMul", {s("g_z", i), s("w", i)}, {s("g_h", i - 1)}, r, gpu(r),
           {{"transpose_b", true}});
    }
    b.op(s("fc_grad_w", i), "MatMul", {prev, s("g_z", i)}, {s("g_w", i)}, r, gpu(r),
         {{"transpose_a", true}});
    b.op(s("sgd", i), "ApplySGD", {s("w", i), s("g_w", i)}, {s("w_new", i)}, r, gpu(r),
         {{"learning_rate", 0.01}});
  }
  return b.take();
}

GraphFile parameter_server(int workers, int servers, int layers, int64_t batch, int64_t hidden) {
  Builder b("parameter_server");
  auto server_of = [&](int p) { return p % servers; };
  auto worker_rank = [&](int w) { return servers + w; };
  for (int p = 0; p < layers; ++p) {
    b.tensor(s("w", p), DataType::kF32, {hidden, hidden});
    b.op(s("weights", p), "Variable", {}, {s("w", p)}, server_of(p));
  }
  for (int w = 0; w < workers; ++w) {
    const int r = worker_rank(w);
    const std::string pre = "worker" + std::to_string(w) + "/";
    b.tensor(pre + "x", DataType::kF32, {batch, hidden});
    b.op(pre + "input", "Input", {}, {pre + "x"}, r, "gpu:0");
    std::string prev = pre + "x";
    for (int p = 0; p < layers; ++p) {
      b.tensor(pre + s("h", p), DataType::kF32, {batch, hidden});
      b.op(pre + s("fc", p), "DenseRelu", {prev, s("w", p)}, {pre + s("h", p)}, r, "gpu:0");
      prev = pre + s("h", p);
    }
    b.tensor(pre + "loss", DataType::kF32, {});
    b.tensor(pre + s("g_h", layers - 1), DataType::kF32, {batch, hidden});
    b.op(pre + "loss", "MeanSquaredError", {prev}, {pre + "loss", pre + s("g_h", layers - 1)}, r,
         "gpu:0");
    for (int p = layers - 1; p >= 0; --p) {
      const std::string in = p == 0 ? pre + "x" : pre + s("h", p - 1);
      b.tensor(pre + s("g_w", p), DataType::kF32, {hidden, hidden});
      std::vector<std::string> outs{pre + s("g_w", p)};
      if (p > 0) {
        b.tensor(pre + s("g_h", p - 1), DataType::kF32, {batch, hidden});
        outs.push_back(pre + s("g_h", p - 1));
      }
      b.op(pre + s("fc_grad", p), "DenseReluGrad",
           {pre + s("g_h", p), in, s("w", p), pre + s("h", p)}, outs, r, "gpu:0");
    }
  }
  for (int p = 0; p < layers; ++p) {
    std::vector<std::string> grads;
    for (int w = 0; w < workers; ++w)
      grads.push_back("worker" + std::to_string(w) + "/g_w" + std::to_string(p));
    b.tensor(s("g_sum", p), DataType::kF32, {hidden, hidden});
    b.tensor(s("w_new", p), DataType::kF32, {hidden, hidden});
    b.op(s("aggregate", p), "AddN", grads, {s("g_sum", p)}, server_of(p));
    b.op(s("apply", p), "ApplySGD", {s("w", p), s("g_sum", p)}, {s("w_new", p)}, server_of(p),
         "cpu:0", {{"learning_rate", 0.01}, {"scale", 1.0 / workers}});
  }
  return b.take();
}

GraphFile unrolled_rnn(int steps, int64_t batch, int64_t hidden, int64_t vocab) {
  Builder b("unrolled_rnn");
  const int64_t max_len = 128;
  // Rank 0: the encoder over a source of run-time length.
  b.tensor("src_tokens", DataType::kI32, {kUnknownDim, batch});
  b.tensor("enc_out", DataType::kF32, {kUnknownDim, batch, hidden},
           static_cast<uint64_t>(max_len * batch * hidden * 4));
  b.tensor("s1_0", DataType::kF32, {batch, hidden});
  b.tensor("s2_0", DataType::kF32, {batch, hidden});
  b.tensor("y_0", DataType::kI32, {batch});
  b.op("source", "Input", {}, {"src_tokens"}, 0);
  b.op("encoder", "LSTMSequence", {"src_tokens"}, {"enc_out", "s1_0"}, 0, "cpu:0",
       {{"hidden", hidden}});
  b.op("decoder_init", "Zeros", {}, {"s2_0"}, 1);
  b.op("bos", "Fill", {}, {"y_0"}, 0, "cpu:0", {{"value", int64_t{1}}});
  std::vector<std::string> tokens;
  for (int t = 1; t <= steps; ++t) {
    b.tensor(s("e_", t), DataType::kF32, {batch, hidden});
    b.tensor(s("s1_", t), DataType::kF32, {batch, hidden});
    b.tensor(s("s2_", t), DataType::kF32, {batch, hidden});
    b.tensor(s("c_", t), DataType::kF32, {batch, hidden});
    b.tensor(s("logits_", t), DataType::kF32, {batch, vocab});
    b.tensor(s("y_", t), DataType::kI32, {batch});
    b.op(s("embed_", t), "Embedding", {s("y_", t - 1)}, {s("e_", t)}, 0);
    b.op(s("cell1_", t), "LSTMCell", {s("e_", t), s("s1_", t - 1)}, {s("s1_", t)}, 0);
    b.op(s("cell2_", t), "LSTMCell", {s("s1_", t), s("s2_", t - 1)}, {s("s2_", t)}, 1);
    b.op(s("attention_", t), "Attention", {s("s2_", t), "enc_out"}, {s("c_", t)}, 1);
    b.op(s("project_", t), "MatMul", {s("c_", t)}, {s("logits_", t)}, 1);
    b.op(s("argmax_", t), "ArgMax", {s("logits_", t)}, {s("y_", t)}, 1);
    tokens.push_back(s("y_", t));
  }
  b.tensor("translation", DataType::kI32, {static_cast<int64_t>(steps), batch});
  b.op("collect", "Stack", tokens, {"translation"}, 1);
  return b.take();
}

GraphFile random_dag(uint64_t seed, int ops, int ranks) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  GraphFile f;
  f.graph.name = "random" + std::to_string(seed);
  // Tensors first (op i writes t<i>_0 and maybe t<i>_1), then ops in a shuffled order.
  std::vector<std::vector<std::string>> outs(static_cast<size_t>(ops));
  for (int i = 0; i < ops; ++i) {
    const int n = pick(4) == 0 ? 2 : 1;
    for (int k = 0; k < n; ++k) {
      std::string name = "t" + std::to_string(i) + "_" + std::to_string(k);
      DataType dt = kAllDataTypes[pick(9)];
      Shape shape;
      const int rank = pick(4);
      for (int d = 0; d < rank; ++d) shape.push_back(pick(8) == 0 ? kUnknownDim : 1 + pick(64));
      uint64_t hint = (!is_static(shape) && pick(2)) ? static_cast<uint64_t>(1 + pick(100000)) : 0;
      (void)f.graph.add_tensor(name, dt, shape, hint);
      outs[static_cast<size_t>(i)].push_back(std::move(name));
    }
  }
  std::vector<int> order(static_cast<size_t>(ops));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  f.placement.rank.clear();
  for (int i : order) {
    std::vector<std::string> in;
    const int nin = i == 0 ? 0 : pick(4);
    for (int k = 0; k < nin; ++k) {
      // Mostly recent producers, sometimes far back (long-lived tensors).
      int j = pick(3) == 0 ? pick(i) : std::max(0, i - 1 - pick(std::min(i, 8)));
      const auto& o = outs[static_cast<size_t>(j)];
      in.push_back(o[static_cast<size_t>(pick(static_cast<int>(o.size())))]);
    }
    (void)f.graph.add_op("op" + std::to_string(i), pick(2) ? "Compute" : "Other", in,
                         outs[static_cast<size_t>(i)]);
    f.placement.rank.push_back(pick(ranks));
    f.placement.device.push_back("cpu:0");
  }
  return f;
}

Graph layered(int ops, int width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Graph g;
  g.name = "layered" + std::to_string(ops);
  std::vector<std::string> prev, prev2, cur;
  for (int i = 0; i < ops; ++i) {
    const int layer = i / width;
    if (i % width == 0 && i) {
      prev2 = std::move(prev);
      prev = std::move(cur);
      cur.clear();
    }
    std::string out = "t" + std::to_string(i);
    Shape shape = pick(50) == 0 ? Shape{kUnknownDim, 256} : Shape{64, 64 * (1 + pick(8))};
    (void)g.add_tensor(out, DataType::kF32, shape);
    std::vector<std::string> in;
    if (layer > 0) {
      const int nin = 1 + pick(3);
      for (int k = 0; k < nin; ++k) {
        const auto& from = (layer > 1 && pick(4) == 0) ? prev2 : prev;
        in.push_back(from[static_cast<size_t>(pick(static_cast<int>(from.size())))]);
      }
    }
    (void)g.add_op("op" + std::to_string(i), layer ? "Compute" : "Input", in, {out});
    cur.push_back(std::move(out));
  }
  return g;
}

}  // namespace rdmaflow::graph::synthetic
