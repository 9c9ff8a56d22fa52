// MatMul: c = op(a) * op(b), op = transpose when "transpose_a" / "transpose_b".
// With the transposes it is also the gradient of a dense layer:
//   dL/dW = x^T * g   (transpose_a),   dL/dx = g * W^T   (transpose_b).
#include "examples/trainer/kernel.h"
#include "examples/trainer/kernels/eigen_maps.h"

namespace rdmaflow::exec {

Status matmul_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 2) return ctx.error("MatMul takes 2 inputs");
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(a, DataType::kF32, 2, ctx.op().name + " input a"));
  RDMAFLOW_RETURN_IF_ERROR(expect_tensor(b, DataType::kF32, 2, ctx.op().name + " input b"));
  RDMAFLOW_ASSIGN_OR_RETURN(bool ta, ctx.attr_bool("transpose_a", false));
  RDMAFLOW_ASSIGN_OR_RETURN(bool tb, ctx.attr_bool("transpose_b", false));
  const int64_t m = ta ? a.dim(1) : a.dim(0);
  const int64_t k = ta ? a.dim(0) : a.dim(1);
  const int64_t kb = tb ? b.dim(1) : b.dim(0);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  if (k != kb) {
    return ctx.error("inner dimensions differ: a" + dims_to_string(a.dims) + (ta ? "^T" : "") +
                     " * b" + dims_to_string(b.dims) + (tb ? "^T" : ""));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(TensorView c, ctx.allocate_output(0, DataType::kF32, {m, n}));
  auto A = matrix(a);
  auto B = matrix(b);
  auto C = mutable_matrix(c);
  if (!ta && !tb) {
    C.noalias() = A * B;
  } else if (ta && !tb) {
    C.noalias() = A.transpose() * B;
  } else if (!ta && tb) {
    C.noalias() = A * B.transpose();
  } else {
    C.noalias() = A.transpose() * B.transpose();
  }
  return Status::ok();
}

}  // namespace rdmaflow::exec
