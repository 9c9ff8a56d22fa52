// Relu: y = max(x, 0); ReluGrad(g, y): dx = g where y > 0, else 0.
#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status relu_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 1) return ctx.error("Relu takes 1 input");
  const TensorView& x = ctx.input(0);
  if (x.dtype != DataType::kF32) return ctx.error("Relu needs f32");
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView y, ctx.allocate_output(0, DataType::kF32, x.dims));
  mutable_flat(y) = flat(x).max(0.0f);
  return Status::ok();
}

Status relu_grad_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 2) return ctx.error("ReluGrad takes 2 inputs (gradient, relu output)");
  const TensorView& g = ctx.input(0);
  const TensorView& y = ctx.input(1);
  if (g.dtype != DataType::kF32 || y.dtype != DataType::kF32 || g.dims != y.dims) {
    return ctx.error("gradient" + dims_to_string(g.dims) + " and output" + dims_to_string(y.dims) +
                     " must be f32 of one shape");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView dx, ctx.allocate_output(0, DataType::kF32, g.dims));
  mutable_flat(dx) = (flat(y) > 0.0f).select(flat(g), 0.0f);
  return Status::ok();
}

}  // namespace rdmaflow::exec
