// Tensors as the reference executor sees them: a view (dtype, shape, bytes)
// of memory someone else owns, and the heap buffers the executor owns for
// tensors that never leave the rank.
//
// A view may point into a session's registered memory (an output buffer the
// plan placed, or a receive slot): kernels read and write it in place, which
// is how a transfer avoids every staging copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace rdmaflow::exec {

using Dims = std::vector<int64_t>;

// Elements of a static shape (1 for a scalar); -1 if a dimension is negative.
int64_t num_elements(const Dims& dims);

// "[64,1024]".
std::string dims_to_string(const Dims& dims);

struct TensorView {
  DataType dtype = DataType::kF32;
  Dims dims;
  void* data = nullptr;
  size_t bytes = 0;  // num_elements(dims) * dtype_size(dtype)

  int64_t elements() const { return num_elements(dims); }
  int rank() const { return static_cast<int>(dims.size()); }
  int64_t dim(int i) const { return dims[static_cast<size_t>(i)]; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::span<const std::byte> raw() const { return {static_cast<const std::byte*>(data), bytes}; }
};

// Checks `view` has `dtype` and `rank` dimensions; the error names `what`.
Status expect_tensor(const TensorView& view, DataType dtype, int rank, const std::string& what);

// Heap memory for one tensor, grown on demand and reused step after step.
class HostBuffer {
 public:
  // At least `bytes` (64-byte aligned); keeps the old block when it is big enough.
  void* reserve(size_t bytes);
  void* data() const { return ptr_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t capacity_ = 0;
};

}  // namespace rdmaflow::exec
