// Compute kernels of the reference executor and the registry that finds them
// by op type.
//
// A kernel reads its inputs (views, possibly into registered memory) and asks
// the context for each output. The context decides where an output lives: in
// the registered buffer the transfer plan assigned to it when the tensor is
// sent to another rank (so the Send needs no copy), otherwise in heap memory
// the executor reuses from step to step. Kernels never allocate tensors
// themselves and never throw; bad shapes are a Status naming the op.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "examples/trainer/tensor.h"
#include "graph/ir.h"

namespace rdmaflow::exec {

class KernelContext {
 public:
  virtual ~KernelContext() = default;

  virtual const graph::Op& op() const = 0;
  virtual int num_inputs() const = 0;
  virtual const TensorView& input(int i) const = 0;
  // The memory for output `i`, sized for `dims`; valid until the step ends.
  virtual Result<TensorView> allocate_output(int i, DataType dtype, const Dims& dims) = 0;

  // Attribute accessors; a missing attribute gives `fallback`, a wrong type an error.
  Result<bool> attr_bool(const std::string& name, bool fallback) const;
  Result<double> attr_double(const std::string& name, double fallback) const;
  Result<int64_t> attr_int(const std::string& name, int64_t fallback) const;

  // An error for this op: "run MatMul 'fc1' failed: invalid argument: <reason>".
  Status error(const std::string& reason) const;
};

using Kernel = std::function<Status(KernelContext&)>;

// Registers `kernel` for ops of `type` (replacing an earlier one).
void register_kernel(const std::string& type, Kernel kernel);
// The kernel for `type`; kNotFound naming the type and the known ones.
Result<Kernel> find_kernel(const std::string& type);
std::vector<std::string> kernel_types();

}  // namespace rdmaflow::exec
