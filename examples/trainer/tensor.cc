#include "examples/trainer/tensor.h"

#include <algorithm>
#include <cstdlib>

namespace rdmaflow::exec {

int64_t num_elements(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

std::string dims_to_string(const Dims& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

Status expect_tensor(const TensorView& view, DataType dtype, int rank, const std::string& what) {
  if (view.dtype != dtype || view.rank() != rank || view.data == nullptr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "run kernel", -1,
                          what + ": expected a rank-" + std::to_string(rank) + " " +
                              std::string(dtype_name(dtype)) + " tensor, got " +
                              std::string(dtype_name(view.dtype)) + dims_to_string(view.dims));
  }
  return Status::ok();
}

void HostBuffer::Free::operator()(void* p) const {
  std::free(p);
}

void* HostBuffer::reserve(size_t bytes) {
  if (ptr_ && capacity_ >= bytes) return ptr_.get();
  const size_t cap = (std::max<size_t>(bytes, 64) + 63) & ~size_t{63};
  ptr_.reset(std::aligned_alloc(64, cap));
  capacity_ = ptr_ ? cap : 0;
  return ptr_.get();
}

}  // namespace rdmaflow::exec
