// The reference executor's kernels against naive loops, and their gradients
// against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "examples/trainer/kernel.h"

namespace rdmaflow::exec {
namespace {

// A tensor with its own storage.
struct Owned {
  TensorView view;
  std::vector<uint8_t> mem;
  Owned() = default;
  Owned(DataType dt, Dims dims) {
    view.dtype = dt;
    view.dims = std::move(dims);
    view.bytes = static_cast<size_t>(num_elements(view.dims)) * dtype_size(dt);
    mem.resize(std::max<size_t>(view.bytes, 8));
    view.data = mem.data();
  }
  float* f() { return view.as<float>(); }
  float& at(int64_t i) { return f()[i]; }
  int64_t n() const { return view.elements(); }
};

Owned random_tensor(Dims dims, std::mt19937& rng, float lo = -1, float hi = 1) {
  Owned t(DataType::kF32, std::move(dims));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.n(); ++i) t.at(i) = u(rng);
  return t;
}

class TestContext final : public KernelContext {
 public:
  TestContext(std::string type, std::vector<Owned*> inputs, size_t outputs,
              graph::Attributes attrs = {}) {
    op_.name = "test_" + type;
    op_.type = std::move(type);
    op_.attrs = std::move(attrs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      op_.inputs.push_back(static_cast<graph::TensorId>(i));
      inputs_.push_back(inputs[i]->view);
    }
    for (size_t i = 0; i < outputs; ++i) op_.outputs.push_back(static_cast<graph::TensorId>(i));
    out_.resize(outputs);
  }
  const graph::Op& op() const override { return op_; }
  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  const TensorView& input(int i) const override { return inputs_[static_cast<size_t>(i)]; }
  Result<TensorView> allocate_output(int i, DataType dtype, const Dims& dims) override {
    out_[static_cast<size_t>(i)] = Owned(dtype, dims);
    return out_[static_cast<size_t>(i)].view;
  }
  Owned& out(int i) { return out_[static_cast<size_t>(i)]; }

 private:
  graph::Op op_;
  std::vector<TensorView> inputs_;
  std::vector<Owned> out_;
};

// Runs a kernel; returns its outputs.
std::vector<Owned> run(const std::string& type, std::vector<Owned*> in, size_t outputs,
                       graph::Attributes attrs = {}) {
  TestContext ctx(type, std::move(in), outputs, std::move(attrs));
  auto k = find_kernel(type);
  EXPECT_TRUE(k.is_ok()) << k.status().to_string();
  Status st = (*k)(ctx);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::vector<Owned> out;
  for (size_t i = 0; i < outputs; ++i) out.push_back(std::move(ctx.out(static_cast<int>(i))));
  return out;
}

float elem(Owned& t, int64_t r, int64_t c) {
  return t.at(r * t.view.dim(1) + c);
}

TEST(Kernels, MatMulAllTransposeCombinations) {
  std::mt19937 rng(1);
  const int64_t m = 5, k = 7, n = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Owned a = random_tensor(ta ? Dims{k, m} : Dims{m, k}, rng);
      Owned b = random_tensor(tb ? Dims{n, k} : Dims{k, n}, rng);
      auto out = run("MatMul", {&a, &b}, 1, {{"transpose_a", ta}, {"transpose_b", tb}});
      ASSERT_EQ(out[0].view.dims, (Dims{m, n}));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t q = 0; q < k; ++q) {
            want += (ta ? elem(a, q, i) : elem(a, i, q)) * (tb ? elem(b, j, q) : elem(b, q, j));
          }
          EXPECT_NEAR(elem(out[0], i, j), want, 1e-5) << ta << tb << " at " << i << "," << j;
        }
      }
    }
  }
}

TEST(Kernels, MatMulRefusesMismatchedShapes) {
  std::mt19937 rng(2);
  Owned a = random_tensor({3, 4}, rng);
  Owned b = random_tensor({5, 2}, rng);
  TestContext ctx("MatMul", {&a, &b}, 1);
  Status st = (*find_kernel("MatMul"))(ctx);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.to_string().find("inner dimensions"), std::string::npos) << st.to_string();
}

TEST(Kernels, BiasAddAndItsGradient) {
  std::mt19937 rng(3);
  Owned x = random_tensor({4, 6}, rng);
  Owned b = random_tensor({6}, rng);
  auto y = run("BiasAdd", {&x, &b}, 1);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(elem(y[0], i, j), elem(x, i, j) + b.at(j));
  auto db = run("BiasAddGrad", {&x}, 1);
  ASSERT_EQ(db[0].view.dims, (Dims{6}));
  for (int64_t j = 0; j < 6; ++j) {
    double s = 0;
    for (int64_t i = 0; i < 4; ++i) s += elem(x, i, j);
    EXPECT_NEAR(db[0].at(j), s, 1e-5);
  }
}

TEST(Kernels, ReluAndItsGradient) {
  std::mt19937 rng(4);
  Owned x = random_tensor({3, 5}, rng);
  Owned g = random_tensor({3, 5}, rng);
  auto y = run("Relu", {&x}, 1);
  for (int64_t i = 0; i < x.n(); ++i) EXPECT_EQ(y[0].at(i), std::max(0.0f, x.at(i)));
  auto dx = run("ReluGrad", {&g, &y[0]}, 1);
  for (int64_t i = 0; i < x.n(); ++i) EXPECT_EQ(dx[0].at(i), x.at(i) > 0 ? g.at(i) : 0.0f);
}

TEST(Kernels, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int64_t batch = 4, classes = 5;
  Owned logits = random_tensor({batch, classes}, rng, -2, 2);
  Owned labels(DataType::kI32, {batch});
  for (int64_t i = 0; i < batch; ++i)
    labels.view.as<int32_t>()[i] = static_cast<int32_t>(i % classes);
  auto out = run("SoftmaxCrossEntropy", {&logits, &labels}, 2);
  // Loss against a direct double-precision computation.
  double want = 0;
  for (int64_t i = 0; i < batch; ++i) {
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(elem(logits, i, c)));
    want += std::log(sum) - elem(logits, i, labels.view.as<int32_t>()[i]);
  }
  EXPECT_NEAR(out[0].at(0), want / batch, 1e-5);
  // Gradient against central differences.
  const float eps = 1e-2f;
  for (int64_t i = 0; i < logits.n(); ++i) {
    const float saved = logits.at(i);
    logits.at(i) = saved + eps;
    float up = run("SoftmaxCrossEntropy", {&logits, &labels}, 1)[0].at(0);
    logits.at(i) = saved - eps;
    float down = run("SoftmaxCrossEntropy", {&logits, &labels}, 1)[0].at(0);
    logits.at(i) = saved;
    EXPECT_NEAR(out[1].at(i), (up - down) / (2 * eps), 2e-4) << "logit " << i;
  }
}

TEST(Kernels, SoftmaxCrossEntropyRefusesOutOfRangeLabels) {
  std::mt19937 rng(6);
  Owned logits = random_tensor({2, 3}, rng);
  Owned labels(DataType::kI32, {2});
  labels.view.as<int32_t>()[0] = 0;
  labels.view.as<int32_t>()[1] = 3;
  TestContext ctx("SoftmaxCrossEntropy", {&logits, &labels}, 2);
  Status st = (*find_kernel("SoftmaxCrossEntropy"))(ctx);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.to_string().find("label 3"), std::string::npos) << st.to_string();
}

TEST(Kernels, ApplySgdAndAddN) {
  std::mt19937 rng(7);
  Owned w = random_tensor({3, 2}, rng);
  Owned g = random_tensor({3, 2}, rng);
  Owned h = random_tensor({3, 2}, rng);
  auto w2 = run("ApplySGD", {&w, &g}, 1, {{"learning_rate", 0.5}, {"scale", 0.25}});
  for (int64_t i = 0; i < w.n(); ++i) EXPECT_FLOAT_EQ(w2[0].at(i), w.at(i) - 0.125f * g.at(i));
  auto sum = run("AddN", {&w, &g, &h}, 1);
  for (int64_t i = 0; i < w.n(); ++i) EXPECT_FLOAT_EQ(sum[0].at(i), (w.at(i) + g.at(i)) + h.at(i));
}

TEST(Kernels, UnknownTypeIsNamed) {
  auto k = find_kernel("Conv7D");
  ASSERT_FALSE(k.is_ok());
  EXPECT_NE(k.status().to_string().find("Conv7D"), std::string::npos);
  EXPECT_NE(k.status().to_string().find("MatMul"), std::string::npos);  // lists the known ones
}

}  // namespace
}  // namespace rdmaflow::exec
