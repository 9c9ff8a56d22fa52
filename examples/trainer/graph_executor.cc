#include "examples/trainer/graph_executor.h"

#include <chrono>
#include <cstring>

#include "common/trace.h"
#include "examples/trainer/variable_init.h"

namespace rdmaflow::exec {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

Status op_error(const graph::Op& op, Code code, const std::string& reason) {
  return RDMAFLOW_ERROR(code, "run " + op.type + " '" + op.name + "'", -1, reason);
}

// The declared shape with unknown dimensions filled from `dims`; checks they agree.
bool matches_declared(const graph::Shape& declared, const Dims& dims) {
  if (declared.size() != dims.size()) return false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) return false;
    if (declared[i] != graph::kUnknownDim && declared[i] != dims[i]) return false;
  }
  return true;
}

}  // namespace

std::vector<float> FetchedTensor::as_floats() const {
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

class Executor::Context final : public KernelContext {
 public:
  Context(Executor& ex, const graph::Op& op, uint64_t step) : ex_(ex), op_(op), step_(step) {
    inputs_.reserve(op.inputs.size());
    for (graph::TensorId t : op.inputs) inputs_.push_back(ex.values_[static_cast<size_t>(t)]);
  }
  const graph::Op& op() const override { return op_; }
  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  const TensorView& input(int i) const override { return inputs_[static_cast<size_t>(i)]; }
  Result<TensorView> allocate_output(int i, DataType dtype, const Dims& dims) override {
    if (i < 0 || static_cast<size_t>(i) >= op_.outputs.size()) {
      return error("asked for output " + std::to_string(i) + " of " +
                   std::to_string(op_.outputs.size()));
    }
    return ex_.allocate(op_.outputs[static_cast<size_t>(i)], dtype, dims, step_);
  }

 private:
  Executor& ex_;
  const graph::Op& op_;
  uint64_t step_;
  std::vector<TensorView> inputs_;
};

Result<std::unique_ptr<Executor>> Executor::create(const graph::RankGraph& rank_graph,
                                                   const graph::TransferPlan& plan, int rank,
                                                   Session* session, ExecutorHooks hooks,
                                                   ExecutorOptions options) {
  const char* op = "create executor";
  if (rank < 0 || static_cast<size_t>(rank) >= plan.ranks.size()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "rank " + std::to_string(rank) + " is not in the plan");
  }
  std::unique_ptr<Executor> ex(new Executor());
  ex->graph_ = rank_graph.graph;
  ex->rank_ = rank;
  ex->session_ = session;
  ex->hooks_ = std::move(hooks);
  ex->options_ = std::move(options);
  const graph::Graph& g = ex->graph_;
  ex->values_.resize(g.num_tensors());
  ex->heap_.resize(g.num_tensors());
  ex->fetch_.assign(g.num_tensors(), false);
  for (const auto& name : ex->options_.fetches) {
    auto t = g.find_tensor(name);
    if (!t) {
      return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                            "fetch '" + name + "' names no tensor of rank " + std::to_string(rank));
    }
    ex->fetch_[static_cast<size_t>(*t)] = true;
  }
  for (const auto& s : plan.ranks[static_cast<size_t>(rank)].schedule) {
    auto id = g.find_op(s.name);
    if (!id) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "the plan schedules '" + s.name + "', which rank " +
                                std::to_string(rank) + "'s graph does not have");
    }
    const graph::Op& o = g.op(*id);
    Scheduled sch;
    sch.op = *id;
    sch.kind = s.kind;
    sch.transfer = s.transfer;
    if (s.kind != graph::OpKind::kCompute && !session) {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, op, -1,
          "'" + s.name + "' moves a tensor between ranks but there is no session");
    }
    if (s.kind == graph::OpKind::kCompute && o.type == "Variable") {
      if (o.outputs.size() != 1 || !o.inputs.empty()) {
        return op_error(o, Code::kInvalidArgument, "a Variable has no inputs and one output");
      }
      const graph::Tensor& t = g.tensor(o.outputs[0]);
      auto bytes = graph::static_bytes(t.dtype, t.shape);
      if (!bytes || t.dtype != DataType::kF32) {
        return op_error(o, Code::kInvalidArgument, "a Variable must be a static f32 tensor");
      }
      Variable v;
      v.tensor = o.outputs[0];
      v.bytes = *bytes;
      v.state.reserve(v.bytes);
      RDMAFLOW_RETURN_IF_ERROR(
          init_variable(o, t.shape, ex->options_.seed, static_cast<float*>(v.state.data())));
      ex->var_of_tensor_[v.tensor] = o.name;
      ex->variables_.emplace(o.name, std::move(v));
    } else if (s.kind == graph::OpKind::kCompute && o.type != "Input" && o.type != "AllReduce") {
      RDMAFLOW_ASSIGN_OR_RETURN(sch.kernel, find_kernel(o.type));
    }
    ex->schedule_.push_back(std::move(sch));
  }
  return ex;
}

Result<TensorView> Executor::allocate(graph::TensorId t, DataType dtype, const Dims& dims,
                                      uint64_t step) {
  const graph::Tensor& decl = graph_.tensor(t);
  if (dtype != decl.dtype || !matches_declared(decl.shape, dims)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "allocate output", -1,
                          "'" + decl.name + "' is declared " + std::string(dtype_name(decl.dtype)) +
                              graph::shape_to_string(decl.shape) + ", the kernel made " +
                              std::string(dtype_name(dtype)) + dims_to_string(dims));
  }
  TensorView v;
  v.dtype = dtype;
  v.dims = dims;
  v.bytes = static_cast<size_t>(num_elements(dims)) * dtype_size(dtype);
  if (session_) {
    RDMAFLOW_ASSIGN_OR_RETURN(std::optional<SessionBuffer> buf,
                              session_->output_buffer(decl.name, step, v.bytes));
    if (buf) v.data = buf->data;
  }
  if (!v.data) {
    v.data = heap_[static_cast<size_t>(t)].reserve(v.bytes);
    if (!v.data) {
      return RDMAFLOW_ERROR(
          Code::kResourceExhausted, "allocate output", -1,
          "no memory for '" + decl.name + "' (" + std::to_string(v.bytes) + " bytes)");
    }
  }
  values_[static_cast<size_t>(t)] = v;
  return v;
}

void Executor::capture(graph::TensorId t) {
  if (!fetch_[static_cast<size_t>(t)]) return;
  const TensorView& v = values_[static_cast<size_t>(t)];
  FetchedTensor& f = fetched_[graph_.tensor(t).name];
  f.dtype = v.dtype;
  f.dims = v.dims;
  f.bytes.assign(static_cast<const uint8_t*>(v.data),
                 static_cast<const uint8_t*>(v.data) + v.bytes);
}

Status Executor::run_op(const Scheduled& s, uint64_t step) {
  const graph::Op& op = graph_.op(s.op);
  const trace::Span span(
      trace::kOp, op.name,
      {.step = static_cast<int64_t>(step), .label_key = "type", .label = op.type});
  const auto t0 = Clock::now();
  double* bucket = &profile_.compute_ms;
  if (s.kind == graph::OpKind::kSend) {
    bucket = &profile_.send_ms;
    const TensorView& v = values_[static_cast<size_t>(op.inputs.at(0))];
    SendSource src{v.data, v.bytes, v.dims};
    RDMAFLOW_RETURN_IF_ERROR(session_->send(static_cast<graph::TransferId>(s.transfer), step, src));
  } else if (s.kind == graph::OpKind::kRecv) {
    bucket = &profile_.recv_ms;
    RDMAFLOW_ASSIGN_OR_RETURN(RecvView r,
                              session_->recv(static_cast<graph::TransferId>(s.transfer), step));
    const graph::TensorId out = op.outputs.at(0);
    values_[static_cast<size_t>(out)] =
        TensorView{r.dtype, r.dims, const_cast<void*>(r.data), r.bytes};
    capture(out);
  } else if (op.type == "Variable") {
    Variable& var = variables_.at(op.name);
    const graph::Tensor& decl = graph_.tensor(var.tensor);
    TensorView v{decl.dtype, decl.shape, var.state.data(), var.bytes};
    std::optional<SessionBuffer> planned;
    if (session_) {
      RDMAFLOW_ASSIGN_OR_RETURN(planned, session_->output_buffer(decl.name, step, var.bytes));
    }
    if (planned) {  // sent to other ranks: the one copy into registered memory
      std::memcpy(planned->data, var.state.data(), var.bytes);
      v.data = planned->data;
    }
    values_[static_cast<size_t>(var.tensor)] = v;
    capture(var.tensor);
  } else if (op.type == "Input") {
    if (!hooks_.feed) return op_error(op, Code::kInvalidArgument, "no feed for Input ops");
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      const graph::Tensor& decl = graph_.tensor(op.outputs[i]);
      if (!graph::is_static(decl.shape)) {
        return op_error(op, Code::kInvalidArgument, "Input tensors must have static shapes");
      }
      RDMAFLOW_ASSIGN_OR_RETURN(TensorView v,
                                allocate(op.outputs[i], decl.dtype, decl.shape, step));
      RDMAFLOW_RETURN_IF_ERROR(hooks_.feed(op, step, static_cast<int>(i), v));
      capture(op.outputs[i]);
    }
  } else if (op.type == "AllReduce") {
    bucket = &profile_.allreduce_ms;
    if (!hooks_.allreduce) return op_error(op, Code::kInvalidArgument, "no allreduce hook");
    if (op.inputs.size() != 1 || op.outputs.size() != 1) {
      return op_error(op, Code::kInvalidArgument, "AllReduce takes one input and one output");
    }
    const TensorView& in = values_[static_cast<size_t>(op.inputs[0])];
    RDMAFLOW_ASSIGN_OR_RETURN(TensorView out, allocate(op.outputs[0], in.dtype, in.dims, step));
    std::memcpy(out.data, in.data, in.bytes);
    RDMAFLOW_RETURN_IF_ERROR(hooks_.allreduce(op, step, out));
    capture(op.outputs[0]);
  } else {
    Context ctx(*this, op, step);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (!ctx.input(static_cast<int>(i)).data) {
        return op_error(op, Code::kInternal,
                        "input '" + graph_.tensor(op.inputs[i]).name + "' was not produced");
      }
    }
    RDMAFLOW_RETURN_IF_ERROR(s.kernel(ctx));
    for (graph::TensorId t : op.outputs) {
      if (!values_[static_cast<size_t>(t)].data) {
        return op_error(op, Code::kInternal,
                        "the kernel did not produce '" + graph_.tensor(t).name + "'");
      }
      capture(t);
    }
    if (op.type == "ApplySGD") {
      auto it = var_of_tensor_.find(op.inputs.at(0));
      if (it != var_of_tensor_.end()) updates_.emplace_back(it->second, op.outputs.at(0));
    }
  }
  const double ms = ms_since(t0);
  *bucket += ms;
  profile_.by_type_ms[op.type] += ms;
  return Status::ok();
}

Status Executor::run_step(uint64_t step) {
  const trace::Span span(trace::kOp, "executor step", {.step = static_cast<int64_t>(step)});
  profile_ = StepProfile{};
  const auto t0 = Clock::now();
  if (session_) {
    auto b = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(session_->begin_step(step));
    profile_.session_ms += ms_since(b);
  }
  for (auto& v : values_) v = TensorView{};
  updates_.clear();
  for (const auto& s : schedule_) {
    Status st = run_op(s, step);
    if (!st.is_ok()) {
      if (session_) (void)session_->end_step(step);
      return st;
    }
  }
  // New variable values: a heap result trades places with the old state; one
  // in registered memory (sent elsewhere) is copied.
  for (const auto& [name, t] : updates_) {
    Variable& var = variables_.at(name);
    HostBuffer& heap = heap_[static_cast<size_t>(t)];
    const TensorView& v = values_[static_cast<size_t>(t)];
    if (v.data == heap.data() && heap.capacity() >= var.bytes) {
      std::swap(var.state, heap);
    } else {
      std::memcpy(var.state.data(), v.data, var.bytes);
    }
  }
  if (session_) {
    auto e = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(session_->end_step(step));
    profile_.session_ms += ms_since(e);
  }
  profile_.total_ms = ms_since(t0);
  return Status::ok();
}

Result<FetchedTensor> Executor::fetched(const std::string& tensor) const {
  auto it = fetched_.find(tensor);
  if (it == fetched_.end()) {
    return RDMAFLOW_ERROR(Code::kNotFound, "fetch", -1,
                          "'" + tensor + "' was not fetched on rank " + std::to_string(rank_) +
                              " (list it in ExecutorOptions::fetches)");
  }
  return it->second;
}

std::vector<std::string> Executor::variable_names() const {
  std::vector<std::string> names;
  for (const auto& [n, v] : variables_) names.push_back(n);
  return names;
}

Result<std::vector<float>> Executor::variable(const std::string& name) const {
  auto it = variables_.find(name);
  if (it == variables_.end()) {
    return RDMAFLOW_ERROR(Code::kNotFound, "read variable", -1,
                          "no variable '" + name + "' on rank " + std::to_string(rank_));
  }
  const auto* p = static_cast<const float*>(it->second.state.data());
  return std::vector<float>(p, p + it->second.bytes / sizeof(float));
}

Status Executor::set_variable(const std::string& name, const std::vector<float>& value) {
  auto it = variables_.find(name);
  if (it == variables_.end() || value.size() * sizeof(float) != it->second.bytes) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "set variable", -1,
                          "no variable '" + name + "' of " + std::to_string(value.size()) +
                              " floats on rank " + std::to_string(rank_));
  }
  std::memcpy(it->second.state.data(), value.data(), it->second.bytes);
  return Status::ok();
}

}  // namespace rdmaflow::exec
