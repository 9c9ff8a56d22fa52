// ApplySGD(w, g) -> w_new = w - learning_rate * scale * g. The executor makes
// w_new the variable's value for the next step (examples/trainer/graph_executor.h).
#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status apply_sgd_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 2) return ctx.error("ApplySGD takes (variable, gradient)");
  const TensorView& w = ctx.input(0);
  const TensorView& g = ctx.input(1);
  if (w.dtype != DataType::kF32 || g.dtype != DataType::kF32 || w.dims != g.dims) {
    return ctx.error("variable" + dims_to_string(w.dims) + " and gradient" +
                     dims_to_string(g.dims) + " must be f32 of one shape");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(double lr, ctx.attr_double("learning_rate", 0.01));
  RDMAFLOW_ASSIGN_OR_RETURN(double scale, ctx.attr_double("scale", 1.0));
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView out, ctx.allocate_output(0, DataType::kF32, w.dims));
  mutable_flat(out) = flat(w) - static_cast<float>(lr * scale) * flat(g);
  return Status::ok();
}

}  // namespace rdmaflow::exec
