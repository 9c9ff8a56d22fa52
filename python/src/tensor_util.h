// Tensor helpers of the torch backend's operations (process_group.cc,
// process_group_v.cc): torch dtypes and reductions in rdmaflow's terms, the
// checks every operation makes, and where an operation may write a tensor.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <vector>

#include "collectives/types.h"
#include "common/dtype.h"

namespace rdmaflow::torch_backend {

inline DataType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DataType::kF32;
    case at::kDouble:
      return DataType::kF64;
    case at::kHalf:
      return DataType::kF16;
    case at::kBFloat16:
      return DataType::kBF16;
    case at::kInt:
      return DataType::kI32;
    case at::kLong:
      return DataType::kI64;
    case at::kByte:
      return DataType::kU8;
    case at::kChar:
      return DataType::kI8;
    case at::kBool:
      return DataType::kBool;
    default:
      TORCH_CHECK_TYPE(false, "rdmaflow: tensors of dtype ", t.scalar_type(),
                       " are not supported (float32, float64, float16, bfloat16, int32, int64, "
                       "uint8, int8 and bool are)");
  }
}

inline ReduceOp op_of(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    default:
      TORCH_CHECK_VALUE(false, "rdmaflow: reduce op ", static_cast<int>(op.op_),
                        " is not supported (SUM, PRODUCT, MIN, MAX and AVG are)");
  }
}

inline void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "rdmaflow ", what, ": undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "rdmaflow ", what, ": tensors must be on the CPU, not ",
                    t.device());
  TORCH_CHECK_VALUE(!t.is_sparse(), "rdmaflow ", what, ": sparse tensors are not supported");
}

// The one tensor of a per-device list (CPU: one device).
inline at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "rdmaflow ", what,
                    ": expects one tensor per process (CPU), got ", tensors.size());
  check_cpu(tensors[0], what);
  return tensors[0];
}

inline size_t elems(const at::Tensor& t) {
  return static_cast<size_t>(t.numel());
}

inline void check_match(const at::Tensor& t, const at::Tensor& ref, const char* op,
                        const char* what, const char* ref_what) {
  TORCH_CHECK_VALUE(t.numel() == ref.numel() && t.scalar_type() == ref.scalar_type(), "rdmaflow ",
                    op, ": every ", what, " must match the ", ref_what, " (", ref.numel(),
                    " elements of ", ref.scalar_type(), "), got ", t.numel(), " of ",
                    t.scalar_type());
}

// Where an operation writes `t`: itself when contiguous, else a contiguous
// copy whose result goes back into `t` when the Work finishes.
struct Target {
  at::Tensor buf;
  std::function<void()> finish;
};
inline Target target(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, nullptr};
  at::Tensor buf = t.contiguous();
  return {buf, [t, buf]() mutable { t.copy_(buf); }};
}

}  // namespace rdmaflow::torch_backend
