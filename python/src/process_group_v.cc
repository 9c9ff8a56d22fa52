// The torch backend's operations with a layout per rank (alltoall with any
// split sizes, gather, scatter: all the Communicator's alltoallv), the
// coalesced allgather, and point-to-point send and recv.
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "python/src/process_group.h"
#include "python/src/tensor_util.h"

namespace rdmaflow::torch_backend {
namespace {

// Element counts (`rows` x `row` elements each) and their prefix sums.
void fill(const std::vector<int64_t>& rows, int64_t row, std::vector<size_t>& counts,
          std::vector<size_t>& displs) {
  size_t at = 0;
  for (int64_t r : rows) {
    counts.push_back(static_cast<size_t>(r * row));
    displs.push_back(at);
    at += counts.back();
  }
}

// The split sizes of `t`'s first dimension among `world` ranks: `given`, or
// equal parts when it is empty (as torch's all_to_all_single says).
std::vector<int64_t> splits_of(const at::Tensor& t, const std::vector<int64_t>& given, int world,
                               const char* which) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 0;
  if (given.empty()) {
    TORCH_CHECK_VALUE(rows % world == 0, "rdmaflow alltoall_base: the ", which, " has ", rows,
                      " rows, not divisible among ", world, " ranks (give split sizes)");
    return std::vector<int64_t>(static_cast<size_t>(world), rows / world);
  }
  TORCH_CHECK_VALUE(given.size() == static_cast<size_t>(world),
                    "rdmaflow alltoall_base: ", given.size(), " ", which, " split sizes for ",
                    world, " ranks");
  int64_t sum = 0;
  for (int64_t s : given) {
    TORCH_CHECK_VALUE(s >= 0, "rdmaflow alltoall_base: negative ", which, " split size ", s);
    sum += s;
  }
  TORCH_CHECK_VALUE(sum == rows, "rdmaflow alltoall_base: the ", which, " split sizes add up to ",
                    sum, " but the ", which, " has ", rows, " rows");
  return given;
}

// Elements per row of the first dimension.
int64_t row_elems(const at::Tensor& t) {
  return t.dim() == 0 ? 1 : (t.size(0) == 0 ? 0 : t.numel() / t.size(0));
}

std::vector<at::Tensor> flattened(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : ts) parts.push_back(t.reshape({-1}));
  return parts;
}

// Copies the consecutive pieces of `flat` back into `outs`.
std::function<void()> unflatten(std::vector<at::Tensor> outs, at::Tensor flat) {
  return [outs = std::move(outs), flat]() mutable {
    int64_t at = 0;
    for (at::Tensor& o : outs) {
      o.copy_(flat.narrow(0, at, o.numel()).view_as(o));
      at += o.numel();
    }
  };
}

void check_same_dtype(const std::vector<at::Tensor>& ts, const at::Tensor& ref, const char* what) {
  for (const at::Tensor& t : ts) {
    check_cpu(t, what);
    TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "rdmaflow ", what,
                     ": tensors of one dtype expected, got ", t.scalar_type(), " and ",
                     ref.scalar_type());
  }
}

// gather's (`to_root`) or scatter's layout: n elements between the root and
// every rank, the root's blocks in rank order; every other block empty.
AlltoallvLayout rooted_layout(int world, int rank, int root, size_t n, bool to_root) {
  const std::vector<size_t> none(static_cast<size_t>(world), 0);
  AlltoallvLayout l{none, none, none, none};
  (to_root ? l.send_counts : l.recv_counts)[root] = n;
  if (rank == root) {
    for (int p = 0; p < world; ++p) {
      (to_root ? l.recv_counts : l.send_counts)[p] = n;
      (to_root ? l.recv_displs : l.send_displs)[p] = static_cast<size_t>(p) * n;
    }
  }
  return l;
}

// The root's list of `world` tensors, each like `ref` (the root), or nothing
// (the other ranks, which must not give one).
std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, bool is_root,
                                  int world, int root, const at::Tensor& ref, const char* what,
                                  const char* which, const char* ref_which) {
  if (!is_root) {
    TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "rdmaflow ", what,
                      ": only the root (", root, ") takes ", which, " tensors");
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1 && lists[0].size() == static_cast<size_t>(world), "rdmaflow ",
                    what, ": the root expects one list of ", world, " ", which, " tensors");
  for (const at::Tensor& t : lists[0]) {
    check_cpu(t, what);
    check_match(t, ref, what, which, ref_which);
  }
  return lists[0];
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::launch_v(
    c10d::OpType type, const char* what, const at::Tensor& in, const at::Tensor& out,
    AlltoallvLayout layout, int64_t agree_count, int64_t root, std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> keep, std::function<void()> finish) {
  check_agree(type, in, agree_count, root);
  Request request = comm_->start_alltoallv(in.data_ptr(), elems(in), out.data_ptr(), elems(out),
                                           layout, dtype_of(in), call_options());
  keep.push_back(in);
  keep.push_back(out);
  return track(type, what, std::move(request), std::move(outputs), std::move(keep),
               std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions&) {
  const char* what = "alltoall_base";
  check_cpu(output, what);
  check_cpu(input, what);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "rdmaflow ", what,
                   ": the input is ", input.scalar_type(), ", the output ", output.scalar_type());
  at::Tensor src = input.contiguous();
  Target tg = target(output);
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    TORCH_CHECK_VALUE(input.numel() == output.numel() && input.numel() % size_ == 0, "rdmaflow ",
                      what,
                      ": input and output must hold the same number of elements, "
                      "divisible by the group size ",
                      size_, " (or give split sizes)");
    return launch(c10d::OpType::ALLTOALL_BASE, what, CollectiveKind::kAlltoall, src.data_ptr(),
                  tg.buf.data_ptr(), elems(src) / static_cast<size_t>(size_), src,
                  c10d::ReduceOp::SUM, 0, {output}, {src, tg.buf}, std::move(tg.finish));
  }
  const int64_t row = row_elems(input);
  TORCH_CHECK_VALUE(input.dim() > 0 && output.dim() > 0 && row == row_elems(output), "rdmaflow ",
                    what, ": the input and the output need rows of one size, got ", row, " and ",
                    row_elems(output), " elements");
  AlltoallvLayout layout;
  fill(splits_of(input, input_split_sizes, size_, "input"), row, layout.send_counts,
       layout.send_displs);
  fill(splits_of(output, output_split_sizes, size_, "output"), row, layout.recv_counts,
       layout.recv_displs);
  return launch_v(c10d::OpType::ALLTOALL_BASE, what, src, tg.buf, std::move(layout), -1, -1,
                  {output}, {}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions&) {
  const char* what = "alltoall";
  TORCH_CHECK_VALUE(
      outputs.size() == static_cast<size_t>(size_) && inputs.size() == static_cast<size_t>(size_),
      "rdmaflow alltoall: expects ", size_, " input and ", size_, " output tensors, got ",
      inputs.size(), " and ", outputs.size());
  check_same_dtype(inputs, inputs[0], what);
  check_same_dtype(outputs, inputs[0], what);
  AlltoallvLayout layout;
  size_t at = 0;
  for (const at::Tensor& t : inputs) {
    layout.send_counts.push_back(elems(t));
    layout.send_displs.push_back(at);
    at += elems(t);
  }
  at = 0;
  for (const at::Tensor& t : outputs) {
    layout.recv_counts.push_back(elems(t));
    layout.recv_displs.push_back(at);
    at += elems(t);
  }
  at::Tensor flat_in = at::cat(flattened(inputs));
  at::Tensor flat_out = at::empty({static_cast<int64_t>(at)}, inputs[0].options());
  return launch_v(c10d::OpType::ALLTOALL, what, flat_in, flat_out, std::move(layout), -1, -1,
                  outputs, {}, unflatten(outputs, flat_out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* what = "gather";
  at::Tensor& in = single(inputs, what);
  check_root(opts.rootRank, what);
  const int root = static_cast<int>(opts.rootRank);
  const size_t n = elems(in);
  std::vector<at::Tensor> outs =
      root_list(outputs, rank_ == root, size_, root, in, what, "output", "input");
  at::Tensor src = in.contiguous();
  at::Tensor flat = at::empty({static_cast<int64_t>(n * outs.size())}, in.options());
  return launch_v(c10d::OpType::GATHER, what, src, flat, rooted_layout(size_, rank_, root, n, true),
                  static_cast<int64_t>(n), root, outs, {}, unflatten(outs, flat));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* what = "scatter";
  at::Tensor& out = single(outputs, what);
  check_root(opts.rootRank, what);
  const int root = static_cast<int>(opts.rootRank);
  const size_t n = elems(out);
  std::vector<at::Tensor> ins =
      root_list(inputs, rank_ == root, size_, root, out, what, "input", "output");
  at::Tensor flat = ins.empty() ? at::empty({0}, out.options()) : at::cat(flattened(ins));
  Target tg = target(out);
  return launch_v(c10d::OpType::SCATTER, what, flat, tg.buf,
                  rooted_layout(size_, rank_, root, n, false), static_cast<int64_t>(n), root,
                  outputs, {}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* what = "allgather_coalesced";
  TORCH_CHECK_VALUE(!inputs.empty(), "rdmaflow allgather_coalesced: no tensors");
  check_same_dtype(inputs, inputs[0], what);
  TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(size_),
                    "rdmaflow allgather_coalesced: expects ", size_, " lists of outputs, got ",
                    outputs.size());
  std::vector<at::Tensor> outs;  // rank-major: what the flat result holds, in order
  for (auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(),
                      "rdmaflow allgather_coalesced: every list of "
                      "outputs must hold ",
                      inputs.size(), " tensors, not ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      check_cpu(list[i], what);
      check_match(list[i], inputs[i], what, "output", "input");
      outs.push_back(list[i]);
    }
  }
  at::Tensor src = at::cat(flattened(inputs));
  at::Tensor flat = at::empty({src.numel() * size_}, src.options());
  return launch(c10d::OpType::ALLGATHER_COALESCED, what, CollectiveKind::kAllgather, src.data_ptr(),
                flat.data_ptr(), elems(src), src, c10d::ReduceOp::SUM, 0, outs, {src, flat},
                unflatten(outs, flat));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::send(std::vector<at::Tensor>& tensors, int dst,
                                                          int tag) {
  at::Tensor& t = single(tensors, "send");
  TORCH_CHECK_VALUE(dst >= 0 && dst < size_ && dst != rank_, "rdmaflow send: destination ", dst,
                    " is not another rank of a group of ", size_);
  at::Tensor src = t.contiguous();
  CallOptions options;
  options.timeout = Millis(timeout_.count());
  Request request = comm_->start_send(src.data_ptr(), elems(src), dtype_of(src), dst,
                                      static_cast<uint64_t>(static_cast<uint32_t>(tag)), options);
  return track(c10d::OpType::SEND, "send", std::move(request), tensors, {src}, nullptr, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::recv(std::vector<at::Tensor>& tensors, int src,
                                                          int tag) {
  at::Tensor& t = single(tensors, "recv");
  TORCH_CHECK_VALUE(src >= 0 && src < size_ && src != rank_, "rdmaflow recv: source ", src,
                    " is not another rank of a group of ", size_);
  Target tg = target(t);
  CallOptions options;
  options.timeout = Millis(timeout_.count());
  Request request = comm_->start_recv(tg.buf.data_ptr(), elems(tg.buf), dtype_of(tg.buf), src,
                                      static_cast<uint64_t>(static_cast<uint32_t>(tag)), options);
  return track(c10d::OpType::RECV, "recv", std::move(request), tensors, {tg.buf},
               std::move(tg.finish), true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "rdmaflow recv: receiving from any source is not supported (messages are matched "
              "per pair in order): pass src= to torch.distributed.recv");
}

}  // namespace rdmaflow::torch_backend
