// rdmaflow.torch.empty: tensors whose storage the group's transports have
// registered, so the collectives send from them without a staging copy.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <memory>
#include <vector>

#include "python/src/process_group.h"

namespace rdmaflow::torch_backend {

at::Tensor ProcessGroupRdmaflow::empty_registered(std::vector<int64_t> sizes,
                                                  at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    TORCH_CHECK_VALUE(s >= 0, "rdmaflow.torch.empty: negative size ", s, " in ", sizes);
    TORCH_CHECK_VALUE(s == 0 || numel <= (int64_t{1} << 48) / s, "rdmaflow.torch.empty: size ",
                      sizes, " is too large");
    numel *= s;
  }
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  auto buf = comm_->allocate_registered(bytes);
  TORCH_CHECK(buf.is_ok(), "rdmaflow.torch.empty on rank ", rank_, ": ", buf.status().to_string());
  std::shared_ptr<RegisteredBuffer> keep = *buf;
  // The tensor's storage owns the buffer: freeing the tensor deregisters and
  // unmaps it, whether or not the group still exists.
  return at::from_blob(
      keep->data(), sizes, [keep](void*) mutable { keep.reset(); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

size_t ProcessGroupRdmaflow::registered_buffers() const {
  return comm_->registered_buffers();
}

}  // namespace rdmaflow::torch_backend
