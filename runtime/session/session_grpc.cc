#include "runtime/session/session_grpc.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/env.h"

namespace rdmaflow::session_detail {

namespace {
using Clock = std::chrono::steady_clock;

uint8_t* aligned_bytes(size_t bytes) {
  const size_t n = (std::max<size_t>(bytes, 64) + 4095) & ~size_t{4095};
  return static_cast<uint8_t*>(std::aligned_alloc(4096, n));
}
}  // namespace

void GrpcEngine::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

GrpcEngine::GrpcEngine(int rank, int world, std::string reach_address)
    : rank_(rank), world_(world), reach_address_(std::move(reach_address)) {}

GrpcEngine::~GrpcEngine() {
  // Calls still in flight write into the frames: let them end first.
  if (server_) server_->shutdown();
  std::unique_lock<std::mutex> lock(core_->mu);
  core_->cv.wait_for(lock, std::min(timeout_, Millis(5000)), [&] {
    for (const auto& [t, in] : core_->in)
      if (!in.done) return false;
    return true;
  });
}

Status GrpcEngine::setup(const SessionLayout& layout, const AllGather& allgather, Millis timeout) {
  const char* op = "set up session";
  layout_ = &layout;
  timeout_ = timeout;
  frames_.reset(aligned_bytes(layout.total_bytes()));
  if (!frames_) {
    return RDMAFLOW_ERROR(
        Code::kResourceExhausted, op, -1,
        "cannot allocate " + std::to_string(layout.total_bytes()) + " bytes of frames");
  }
  std::memset(frames_.get(), 0, layout.total_bytes());
  GrpcServerOptions so;
  so.rank = rank_;
  so.reach_address = reach_address_;
  so.max_wait = timeout;
  RDMAFLOW_ASSIGN_OR_RETURN(server_, GrpcTensorServer::start(so));
  const std::string& address = server_->address();
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all,
                            allgather(Bytes(address.begin(), address.end())));
  client_ = std::make_unique<GrpcTensorClient>(rank_);
  for (int p : layout.senders) {
    const Bytes& a = all.at(static_cast<size_t>(p));
    RDMAFLOW_RETURN_IF_ERROR(client_->add_peer(p, std::string(a.begin(), a.end())));
    RDMAFLOW_RETURN_IF_ERROR(client_->connect(p, timeout));
  }
  for (graph::TransferId t : layout.recvs) core_->in[t] = Incoming{};
  return Status::ok();
}

Result<SessionBuffer> GrpcEngine::overflow_buffer(size_t output_index, uint64_t step,
                                                  size_t bytes) {
  // publish() copies, so the buffer is free again as soon as send() returned.
  const std::pair<size_t, uint32_t> k{output_index, layout_->frame_of(step)};
  auto& buf = overflow_[k];
  if (!buf || overflow_cap_[k] < bytes) {
    buf.reset(aligned_bytes(bytes));
    overflow_cap_[k] = buf ? bytes : 0;
    if (!buf) {
      return RDMAFLOW_ERROR(Code::kResourceExhausted, "allocate output", -1,
                            "cannot allocate " + std::to_string(bytes) + " bytes");
    }
  }
  return SessionBuffer{buf.get(), bytes};
}

Status GrpcEngine::begin_step(uint64_t step) {
  const uint32_t f = layout_->frame_of(step);
  for (graph::TransferId t : layout_->recvs) {
    const auto& spec = layout_->spec(t);
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      Incoming& in = core_->in[t];
      in = Incoming{};
      in.step = step;
      in.done = false;
    }
    const TensorKey key{t, step};
    std::weak_ptr<Core> weak = core_;
    if (!spec.dynamic) {
      uint8_t* slot = frames_.get() + spec.recv_slot.offset + f * spec.slot_stride;
      client_->recv_tensor_into_async(
          spec.src_rank, key, slot, spec.recv_slot.size, timeout_,
          [weak, t, slot, spec](Result<TensorMeta> meta) {
            auto core = weak.lock();
            if (!core) return;
            std::lock_guard<std::mutex> lock(core->mu);
            Incoming& in = core->in[t];
            in.done = true;
            if (meta.is_ok()) {
              in.view = RecvView{slot, meta->bytes, meta->dtype, meta->shape};
              core->stats.bytes_received += meta->bytes;
            } else {
              in.status = meta.status();
            }
            core->cv.notify_all();
          });
    } else {
      client_->recv_tensor_async(
          spec.src_rank, key, timeout_, [weak, t](Result<ReceivedTensor> got) {
            auto core = weak.lock();
            if (!core) return;
            std::lock_guard<std::mutex> lock(core->mu);
            Incoming& in = core->in[t];
            in.done = true;
            if (got.is_ok()) {
              in.owned = std::make_shared<ReceivedTensor>(std::move(*got));
              in.view = RecvView{in.owned->storage.get(), in.owned->meta.bytes,
                                 in.owned->meta.dtype, in.owned->meta.shape};
              core->stats.bytes_received += in.owned->meta.bytes;
            } else {
              in.status = got.status();
            }
            core->cv.notify_all();
          });
    }
  }
  return Status::ok();
}

Status GrpcEngine::send(graph::TransferId t, uint64_t step, const void* payload, size_t bytes,
                        const std::vector<int64_t>& dims) {
  const auto& spec = layout_->spec(t);
  Status st = server_->publish(TensorKey{t, step}, spec.dtype, dims, payload, bytes);
  if (!st.is_ok()) return st.with_op("send " + layout_->describe(t) + " " + step_text(step));
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->stats.bytes_sent += bytes;
  ++core_->stats.writes;
  return Status::ok();
}

Result<RecvView> GrpcEngine::recv(graph::TransferId t, uint64_t step) {
  std::unique_lock<std::mutex> lock(core_->mu);
  Incoming& in = core_->in[t];
  const auto t0 = Clock::now();
  // The call itself has the deadline; a little grace for gRPC to report it.
  bool done = core_->cv.wait_for(lock, timeout_ + Millis(5000), [&] { return in.done; });
  core_->stats.recv_wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const int peer = layout_->spec(t).src_rank;
  if (!done) {
    return RDMAFLOW_ERROR(Code::kTimeout, "recv", peer,
                          layout_->describe(t) + " " + step_text(step) +
                              ": the RecvTensor call did not complete within " +
                              std::to_string(timeout_.count()) + " ms");
  }
  if (!in.status.is_ok()) {
    return in.status.with_op("recv " + layout_->describe(t) + " " + step_text(step));
  }
  return in.view;
}

Status GrpcEngine::end_step(uint64_t step) {
  (void)step;
  std::unique_lock<std::mutex> lock(core_->mu);
  ++core_->stats.steps;
  // A Recv the executor skipped still writes into this frame: wait for it.
  core_->cv.wait_for(lock, timeout_ + Millis(5000), [&] {
    for (const auto& [t, in] : core_->in)
      if (!in.done) return false;
    return true;
  });
  for (auto& [t, in] : core_->in) in.owned.reset();
  return Status::ok();
}

Status GrpcEngine::finish(const AllGather& allgather) {
  // Every rank has taken what it needs once all have come here.
  auto met = allgather(Bytes{1});
  if (server_) server_->shutdown();
  if (!met) return met.status().with_op("finish session");
  return Status::ok();
}

void GrpcEngine::add_stats(SessionStats& stats) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  stats.steps = core_->stats.steps;
  stats.bytes_sent += core_->stats.bytes_sent;
  stats.bytes_received += core_->stats.bytes_received;
  stats.writes += core_->stats.writes;
  stats.recv_wait_ms += core_->stats.recv_wait_ms;
}

}  // namespace rdmaflow::session_detail
