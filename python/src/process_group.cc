#include "python/src/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/env.h"
#include "python/src/tensor_util.h"
#include "python/src/torch_store.h"

namespace rdmaflow::torch_backend {
namespace {

// The host of the TCPStore under torch's PrefixStores, if that is the store: the
// address the ranks' socket transports should be reachable toward.
std::optional<std::string> tcp_store_host(c10::intrusive_ptr<c10d::Store> store) {
  for (int depth = 0; store && depth < 8; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get())) return tcp->getHost();
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get());
    if (!prefix) break;
    store = prefix->getUnderlyingStore();
  }
  return std::nullopt;
}

// "allreduce", "_allgather_base", ...: torch's name of the operation, as the
// other messages spell operations.
std::string op_name(c10d::OpType type) {
  std::string name = c10d::opTypeToString(type);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

// ---------------- Work ----------------

WorkRdmaflow::WorkRdmaflow(int rank, c10d::OpType type, std::string what, Request request,
                           std::vector<at::Tensor> outputs, std::function<void()> finish)
    : c10d::Work(rank, type),
      what_(std::move(what)),
      request_(std::move(request)),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool WorkRdmaflow::isCompleted() {
  if (lazy_ && request_.test()) settle_once();
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool WorkRdmaflow::wait(std::chrono::milliseconds timeout) {
  if (lazy_) settle_once();
  return c10d::Work::wait(timeout);
}

void WorkRdmaflow::settle_once() {
  std::call_once(settled_, [this] { settle(); });
}

bool WorkRdmaflow::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::vector<at::Tensor> WorkRdmaflow::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkRdmaflow::getFuture() {
  return future_;
}

void WorkRdmaflow::settle() {
  Status st = request_.wait();
  std::exception_ptr error;
  if (st.is_ok()) {
    try {
      if (finish_) finish_();
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    error = std::make_exception_ptr(std::runtime_error(
        "rdmaflow " + what_ + " failed on rank " + std::to_string(rank_) + ": " + st.to_string()));
  }
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// ---------------- the process group ----------------

void ProcessGroupRdmaflow::check_root(int64_t root, const char* op) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "rdmaflow ", op, ": root ", root,
                    " is not a rank of a group of ", size_);
}

ProcessGroupRdmaflow::ProcessGroupRdmaflow(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  BootstrapOptions bo;
  RankInfo info;
  info.rank = rank;
  info.world_size = size;
  if (auto local = env_string("LOCAL_RANK")) info.local_rank = std::atoi(local->c_str());
  if (auto local = env_string("LOCAL_WORLD_SIZE")) {
    info.local_size = std::atoi(local->c_str());
    if (info.local_size == size) info.single_host = true;
  }
  info.source = "torch.distributed";
  bo.rank_info = info;
  bo.timeout = Millis(timeout.count());
  bo.store = std::make_shared<TorchStore>(store, Millis(timeout.count()));
  if (auto master = env_string("MASTER_ADDR")) {
    bo.reach_toward = *master;
  } else if (auto host = tcp_store_host(store)) {
    bo.reach_toward = *host;  // init_method="tcp://HOST:PORT" sets no MASTER_ADDR
  }
  CommunicatorOptions co;
  co.timeout = Millis(timeout.count());
  // DDP computes while its allreduces run: a waiter that spins takes the
  // cores the backward pass needs (resnet18 DDP on 2 ranks: 606 ms a step
  // spinning 10 ms, 298 ms not spinning, on a loaded 2-core host). So the
  // group's waits sleep at once unless RDMAFLOW_COLL_SPIN_US says otherwise.
  if (!env_string("RDMAFLOW_COLL_SPIN_US")) co.spin_us = 0;
  co.p2p = true;  // send and recv
  // One lane for the collectives, so they run one after another in call
  // order (as a NCCL communicator's stream runs them), and one for
  // check_agree's descriptors, which so never wait behind the collectives in
  // flight. DDP starts a bucket's allreduce while the previous one runs: on
  // two lanes they shared the link and the cores, and the comm-heavy DDP step
  // on 2 hosts x 1 took 1.10x longer and 8% more CPU than with them in turn
  // (docs/benchmarks.md, "2 x 1: where the time goes").
  if (!env_string("RDMAFLOW_COLL_LANES")) co.lanes = 2;
  auto check = env_int("RDMAFLOW_TORCH_CHECK", 1);
  TORCH_CHECK_VALUE(check.is_ok() && (*check == 0 || *check == 1),
                    "rdmaflow: RDMAFLOW_TORCH_CHECK must be 0 or 1");
  check_ = *check == 1;
  auto job = Job::create(std::move(bo), co);
  if (auto* failed = std::get_if<Job::Failure>(&job)) {
    TORCH_CHECK(false, "rdmaflow: ", failed->step, " failed on rank ", rank, " of ", size, ": ",
                failed->status.to_string());
  }
  job_ = std::move(std::get<std::unique_ptr<Job>>(job));
  comm_ = &job_->comm();
  // The fabric's last lane is send/recv's; of the collectives' lanes the last
  // carries the descriptors when there are two or more.
  const int lanes = comm_->config().lanes - 1;
  data_lanes_ = std::max(1, lanes - 1);
  check_lane_ = lanes - 1;
  completer_ = std::thread([this] { completion_loop(); });
}

ProcessGroupRdmaflow::~ProcessGroupRdmaflow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (completer_.joinable()) completer_.join();
  job_.reset();
}

std::string ProcessGroupRdmaflow::describe() const {
  return job_->describe();
}

void ProcessGroupRdmaflow::completion_loop() {
  for (;;) {
    c10::intrusive_ptr<WorkRdmaflow> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      work = pending_.front();
      pending_.pop_front();
    }
    work->settle();
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::launch(
    c10d::OpType type, const char* what, CollectiveKind kind, const void* in, void* out,
    size_t count, const at::Tensor& typed, c10d::ReduceOp op, int root,
    std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep, std::function<void()> finish) {
  const DataType dtype = dtype_of(typed);
  const bool reduces = kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kReduce ||
                       kind == CollectiveKind::kReduceScatter;
  TORCH_CHECK_TYPE(!reduces || reducible_dtype(dtype), "rdmaflow ", what, ": tensors of dtype ",
                   typed.scalar_type(),
                   " cannot be reduced (broadcast, allgather and alltoall "
                   "move them)");
  const bool rooted = kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce;
  check_agree(type, typed, static_cast<int64_t>(count), rooted ? root : -1,
              reduces ? static_cast<int64_t>(op.op_) : -1);
  Request request = comm_->start(kind, in, out, count, dtype, op_of(op), root, call_options());
  return track(type, what, std::move(request), std::move(outputs), std::move(keep),
               std::move(finish));
}

CallOptions ProcessGroupRdmaflow::call_options() {
  CallOptions options;
  options.timeout = Millis(timeout_.count());
  options.tag = calls_++ % static_cast<uint64_t>(data_lanes_);
  return options;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::track(
    c10d::OpType type, const char* what, Request request, std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> keep, std::function<void()> finish, bool lazy) {
  // The Work holds every buffer the collective reads or writes until it settles.
  auto done = [keep = std::move(keep), finish = std::move(finish)] {
    if (finish) finish();
  };
  auto work = c10::make_intrusive<WorkRdmaflow>(rank_, type, what, std::move(request),
                                                std::move(outputs), std::move(done));
  if (lazy) {
    work->set_lazy();
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(work);
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupRdmaflow::check_agree(c10d::OpType type, const at::Tensor& typed, int64_t count,
                                       int64_t root, int64_t op) {
  if (!check_ || size_ == 1) return;
  constexpr size_t kFields = 5;
  const int64_t mine[kFields] = {static_cast<int64_t>(type),
                                 static_cast<int64_t>(typed.scalar_type()), count, root, op};
  std::vector<int64_t> all(kFields * static_cast<size_t>(size_));
  CallOptions options;
  options.timeout = Millis(timeout_.count());
  options.tag = static_cast<uint64_t>(check_lane_);
  Status st = comm_->allgather(mine, all.data(), kFields, DataType::kI64, options);
  TORCH_CHECK(st.is_ok(), "rdmaflow ", op_name(type), " failed on rank ", rank_,
              " (comparing the call across ranks): ", st.to_string());
  auto describe = [&](int r) {
    const int64_t* d = &all[kFields * static_cast<size_t>(r)];
    std::string text = "rank " + std::to_string(r) + " calls " +
                       op_name(static_cast<c10d::OpType>(d[0])) + " on " +
                       (d[2] >= 0 ? std::to_string(d[2]) + " elements" : std::string("tensors")) +
                       " of " + c10::toString(static_cast<at::ScalarType>(d[1]));
    if (d[3] >= 0) text += " with root " + std::to_string(d[3]);
    if (d[4] >= 0) text += " reducing by " + std::to_string(d[4]) + " (c10d::ReduceOp)";
    return text;
  };
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(std::equal(all.begin(), all.begin() + kFields, all.begin() + kFields * r),
                "rdmaflow ", op_name(type), ": the ranks disagree: ", describe(0), ", ",
                describe(r),
                " (every rank must call the same operation on tensors of one "
                "dtype and size, with one root)");
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  Target tg = target(t);
  return launch(c10d::OpType::BROADCAST, "broadcast", CollectiveKind::kBroadcast, tg.buf.data_ptr(),
                tg.buf.data_ptr(), elems(tg.buf), tg.buf, c10d::ReduceOp::SUM,
                static_cast<int>(opts.rootRank), tensors, {tg.buf}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  at::Tensor& t = single(tensors, "allreduce");
  Target tg = target(t);
  return launch(c10d::OpType::ALLREDUCE, "allreduce", CollectiveKind::kAllreduce, tg.buf.data_ptr(),
                tg.buf.data_ptr(), elems(tg.buf), tg.buf, opts.reduceOp, 0, tensors, {tg.buf},
                std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "rdmaflow allreduce_coalesced: no tensors");
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) {
    check_cpu(t, "allreduce_coalesced");
    TORCH_CHECK_TYPE(t.scalar_type() == tensors[0].scalar_type(),
                     "rdmaflow allreduce_coalesced: tensors of one dtype expected, got ",
                     t.scalar_type(), " and ", tensors[0].scalar_type());
    parts.push_back(t.reshape({-1}));
  }
  at::Tensor flat = at::cat(parts);
  auto finish = [tensors, flat]() mutable {
    int64_t at = 0;
    for (at::Tensor& t : tensors) {
      t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  };
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced",
                CollectiveKind::kAllreduce, flat.data_ptr(), flat.data_ptr(), elems(flat), flat,
                opts.reduceOp, 0, tensors, {flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  Target tg = target(t);
  return launch(c10d::OpType::REDUCE, "reduce", CollectiveKind::kReduce, tg.buf.data_ptr(),
                tg.buf.data_ptr(), elems(tg.buf), tg.buf, opts.reduceOp,
                static_cast<int>(opts.rootRank), tensors, {tg.buf}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
                    "rdmaflow allgather: expects one list of ", size_, " output tensors");
  for (const at::Tensor& o : outputs[0]) {
    check_cpu(o, "allgather");
    check_match(o, in, "allgather", "output", "input");
  }
  at::Tensor src = in.contiguous();
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  std::vector<at::Tensor> outs = outputs[0];
  auto finish = [outs, flat, n = in.numel()]() mutable {
    for (size_t r = 0; r < outs.size(); ++r) {
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view_as(outs[r]));
    }
  };
  return launch(c10d::OpType::ALLGATHER, "allgather", CollectiveKind::kAllgather, src.data_ptr(),
                flat.data_ptr(), elems(src), src, c10d::ReduceOp::SUM, 0, outs, {src, flat},
                std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  check_cpu(output, "_allgather_base");
  check_cpu(input, "_allgather_base");
  TORCH_CHECK_VALUE(
      output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
      "rdmaflow _allgather_base: the output must hold ", size_, " x ", input.numel(),
      " elements of ", input.scalar_type(), ", not ", output.numel(), " of ", output.scalar_type());
  at::Tensor src = input.contiguous();
  Target tg = target(output);
  return launch(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", CollectiveKind::kAllgather,
                src.data_ptr(), tg.buf.data_ptr(), elems(src), src, c10d::ReduceOp::SUM, 0,
                {output}, {src, tg.buf}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
                    "rdmaflow reduce_scatter: expects one list of ", size_, " input tensors");
  std::vector<at::Tensor> parts;
  for (const at::Tensor& i : inputs[0]) {
    check_cpu(i, "reduce_scatter");
    check_match(i, out, "reduce_scatter", "input", "output");
    parts.push_back(i.reshape({-1}));
  }
  at::Tensor flat = at::cat(parts);
  Target tg = target(out);
  return launch(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", CollectiveKind::kReduceScatter,
                flat.data_ptr(), tg.buf.data_ptr(), elems(tg.buf), tg.buf, opts.reduceOp, 0,
                outputs, {flat, tg.buf}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_cpu(output, "_reduce_scatter_base");
  check_cpu(input, "_reduce_scatter_base");
  TORCH_CHECK_VALUE(
      input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
      "rdmaflow _reduce_scatter_base: the input must hold ", size_, " x ", output.numel(),
      " elements of ", output.scalar_type(), ", not ", input.numel(), " of ", input.scalar_type());
  at::Tensor src = input.contiguous();
  Target tg = target(output);
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base",
                CollectiveKind::kReduceScatter, src.data_ptr(), tg.buf.data_ptr(), elems(tg.buf),
                tg.buf, opts.reduceOp, 0, {output}, {src, tg.buf}, std::move(tg.finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRdmaflow::barrier(const c10d::BarrierOptions&) {
  static const at::Tensor kNone = at::empty({0}, at::kByte);
  return launch(c10d::OpType::BARRIER, "barrier", CollectiveKind::kBarrier, nullptr, nullptr, 0,
                kNone, c10d::ReduceOp::SUM, 0, {}, {}, nullptr);
}

}  // namespace rdmaflow::torch_backend
