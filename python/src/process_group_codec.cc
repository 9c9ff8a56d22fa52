// Compressed allreduce on the group's communicator: the entry the DDP
// communication hooks (rdmaflow/torch/hooks.py) call for each gradient bucket.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <memory>
#include <utility>

#include "python/src/process_group.h"
#include "python/src/tensor_util.h"

namespace rdmaflow::torch_backend {

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::allreduce_compressed(
    at::Tensor& tensor, const CodecSpec& codec, std::shared_ptr<CodecState> state, bool average) {
  const char* what = "allreduce_compressed";
  check_cpu(tensor, what);
  TORCH_CHECK_TYPE(tensor.scalar_type() == at::kFloat, "rdmaflow ", what,
                   ": codecs encode float32 tensors, not ", tensor.scalar_type());
  const c10d::ReduceOp op = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  check_agree(c10d::OpType::ALLREDUCE, tensor, tensor.numel(), -1, static_cast<int64_t>(op.op_));
  Target tg = target(tensor);
  CallOptions options = call_options();
  options.codec = codec;
  options.codec_state = state.get();
  Request request = comm_->start_allreduce(tg.buf.data_ptr(), tg.buf.data_ptr(), elems(tg.buf),
                                           DataType::kF32, op_of(op), options);
  // The state is the caller's, but must outlive the call: the Work keeps it.
  auto finish = [state = std::move(state), copy = std::move(tg.finish)] {
    if (copy) copy();
  };
  return track(c10d::OpType::ALLREDUCE, what, std::move(request), {tensor}, {tg.buf},
               std::move(finish));
}

}  // namespace rdmaflow::torch_backend
