// BiasAdd: y[i, j] = x[i, j] + b[j]; its gradient BiasAddGrad: db[j] = sum_i g[i, j].
#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status bias_add_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 2) return ctx.error("BiasAdd takes 2 inputs (x, bias)");
  const TensorView& x = ctx.input(0);
  const TensorView& b = ctx.input(1);
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(x, DataType::kF32, 2, ctx.op().name + " input x"));
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(b, DataType::kF32, 1, ctx.op().name + " input bias"));
  if (b.dim(0) != x.dim(1)) {
    return ctx.error("bias" + dims_to_string(b.dims) + " does not match x" +
                     dims_to_string(x.dims));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView y, ctx.allocate_output(0, DataType::kF32, x.dims));
  ConstVectorMap bias(b.as<const float>(), b.dim(0));
  mutable_matrix(y) = matrix(x).rowwise() + bias.transpose();
  return Status::ok();
}

Status bias_add_grad_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 1) return ctx.error("BiasAddGrad takes 1 input (the gradient)");
  const TensorView& g = ctx.input(0);
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(g, DataType::kF32, 2, ctx.op().name + " input"));
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView db, ctx.allocate_output(0, DataType::kF32, {g.dim(1)}));
  VectorMap(db.as<float>(), g.dim(1)) = matrix(g).colwise().sum().transpose();
  return Status::ok();
}

}  // namespace rdmaflow::exec
