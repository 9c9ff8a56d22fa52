// AddN(x1, ..., xn) -> x1 + ... + xn, summed in input order (so a result does
// not depend on where the inputs came from).
#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status add_n_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() < 1) return ctx.error("AddN takes at least 1 input");
  const TensorView& first = ctx.input(0);
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const TensorView& x = ctx.input(i);
    if (x.dtype != DataType::kF32 || x.dims != first.dims) {
      return ctx.error("input " + std::to_string(i) + dims_to_string(x.dims) +
                       " differs from input 0" + dims_to_string(first.dims) +
                       " (AddN needs f32 inputs of one shape)");
    }
  }
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView out, ctx.allocate_output(0, DataType::kF32, first.dims));
  auto sum = mutable_flat(out);
  sum = flat(first);
  for (int i = 1; i < ctx.num_inputs(); ++i) sum += flat(ctx.input(i));
  return Status::ok();
}

}  // namespace rdmaflow::exec
