// SoftmaxCrossEntropy(logits [B, C] f32, labels [B] i32) -> (loss [], dlogits [B, C]):
// the mean over the batch of -log softmax(logits)[label], and its gradient
// (softmax - onehot(label)) / B. Computed stably (logits shifted by their max).
#include <cmath>

#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status softmax_cross_entropy_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 2) return ctx.error("SoftmaxCrossEntropy takes (logits, labels)");
  const TensorView& logits = ctx.input(0);
  const TensorView& labels = ctx.input(1);
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(logits, DataType::kF32, 2, ctx.op().name + " logits"));
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(labels, DataType::kI32, 1, ctx.op().name + " labels"));
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  if (labels.dim(0) != batch) {
    return ctx.error("labels" + dims_to_string(labels.dims) + " do not match logits" +
                     dims_to_string(logits.dims));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView loss, ctx.allocate_output(0, DataType::kF32, {}));
  TensorView grad;
  const bool want_grad = ctx.op().outputs.size() > 1;
  if (want_grad) {
    RDMAFLOW_ASSIGN_OR_RETURN(grad, ctx.allocate_output(1, DataType::kF32, logits.dims));
  }
  auto z = matrix(logits);
  const int32_t* y = labels.as<const int32_t>();
  double total = 0;
  const float inv_batch = batch > 0 ? 1.0f / static_cast<float>(batch) : 0.0f;
  Eigen::ArrayXf p(classes);
  for (int64_t i = 0; i < batch; ++i) {
    if (y[i] < 0 || y[i] >= classes) {
      return ctx.error("label " + std::to_string(y[i]) + " of row " + std::to_string(i) +
                       " is outside [0, " + std::to_string(classes) + ")");
    }
    const float shift = z.row(i).maxCoeff();
    p = (z.row(i).array() - shift).exp().transpose();
    const float sum = p.sum();
    total += std::log(sum) - (z(i, y[i]) - shift);
    if (want_grad) {
      auto g = mutable_matrix(grad).row(i);
      g = (p / sum * inv_batch).transpose().matrix();
      g(y[i]) -= inv_batch;
    }
  }
  *loss.as<float>() = batch > 0 ? static_cast<float>(total / static_cast<double>(batch)) : 0.0f;
  return Status::ok();
}

}  // namespace rdmaflow::exec
