// Registers the kernels of the reference executor; one file per kernel, one
// line here per op type.
#include <mutex>

#include "examples/trainer/kernel.h"

namespace rdmaflow::exec {

Status matmul_kernel(KernelContext& ctx);
Status bias_add_kernel(KernelContext& ctx);
Status bias_add_grad_kernel(KernelContext& ctx);
Status relu_kernel(KernelContext& ctx);
Status relu_grad_kernel(KernelContext& ctx);
Status softmax_cross_entropy_kernel(KernelContext& ctx);
Status apply_sgd_kernel(KernelContext& ctx);
Status add_n_kernel(KernelContext& ctx);

void register_builtin_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_kernel("MatMul", matmul_kernel);
    register_kernel("BiasAdd", bias_add_kernel);
    register_kernel("BiasAddGrad", bias_add_grad_kernel);
    register_kernel("Relu", relu_kernel);
    register_kernel("ReluGrad", relu_grad_kernel);
    register_kernel("SoftmaxCrossEntropy", softmax_cross_entropy_kernel);
    register_kernel("ApplySGD", apply_sgd_kernel);
    register_kernel("AddN", add_n_kernel);
  });
}

}  // namespace rdmaflow::exec
