// GrpcTensorServer: the rendezvous table and the RecvTensor service.
//
// RecvTensor uses gRPC's callback API, so a call waiting for its tensor holds
// no thread: it is parked in the table as a reactor and finished by whichever
// comes first under the table's mutex — publish (the reply), the call's
// cancellation (the client gave up or vanished), the sweeper thread (the
// call's deadline or max_wait passed), or shutdown. Whoever takes a waiter out
// of the table finishes it, so every call finishes exactly once.
//
// A published tensor is held in its wire form (tensor_wire.h) as gRPC slices,
// handed to gRPC by reference: the only copy on this side is the one publish
// makes, and publish_no_copy makes none (the elements' slice points at the
// caller's memory, like TensorFlow's zero-copy tensor encoding).
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/env.h"
#include "common/log.h"
#include "transport/grpc/grpc_common.h"
#include "transport/grpc/grpc_tensor.h"
#include "transport/grpc/tensor_service.grpc.pb.h"
#include "transport/grpc/tensor_wire.h"

namespace rdmaflow {
namespace {

namespace pb = ::rdmaflow::grpc_tensor;
using Clock = std::chrono::steady_clock;

class RecvReactor;

}  // namespace

struct GrpcTensorServer::Impl {
  // A RecvTensor call waiting for its tensor.
  struct Waiter {
    RecvReactor* reactor = nullptr;
    grpc::ByteBuffer* response = nullptr;
    int dst_rank = -1;
    Clock::time_point since;
    Clock::time_point deadline;
  };

  class Service final
      : public pb::TensorService::WithRawCallbackMethod_RecvTensor<pb::TensorService::Service> {
   public:
    explicit Service(Impl* impl) : impl_(impl) {}
    using WithRawCallbackMethod_RecvTensor::RecvTensor;
    grpc::ServerUnaryReactor* RecvTensor(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

   private:
    Impl* impl_;
  };

  explicit Impl(const GrpcServerOptions& o) : options(o), service(this) {}

  void serve(RecvReactor* reactor, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  void cancelled(RecvReactor* reactor);
  Status put(const TensorKey& key, grpc::ByteBuffer wire, const char* op);
  void sweep();
  void shutdown();

  const GrpcServerOptions options;
  Millis max_wait{0};
  std::string address;
  Service service;
  std::unique_ptr<grpc::Server> server;

  mutable std::mutex mu;
  std::condition_variable sweeper_cv;
  bool closed = false;
  std::map<TensorKey, grpc::ByteBuffer> published;  // wire form of each tensor not yet taken
  std::map<TensorKey, Waiter> waiting;
  std::set<std::pair<Clock::time_point, TensorKey>> deadlines;  // of `waiting`
  std::thread sweeper;
};

namespace {

class RecvReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit RecvReactor(GrpcTensorServer::Impl* impl) : impl_(impl) {}
  void OnCancel() override { impl_->cancelled(this); }
  void OnDone() override { delete this; }

  TensorKey key;
  bool parked = false;  // in Impl::waiting (guarded by Impl::mu)

 private:
  GrpcTensorServer::Impl* impl_;
};

grpc::Status timed_out(const TensorKey& key, int rank, int dst_rank, Millis waited) {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "RecvTensor " + to_string(key) + " for rank " + std::to_string(dst_rank) +
                          ": rank " + std::to_string(rank) + " did not publish it within " +
                          std::to_string(waited.count()) + " ms");
}

}  // namespace

grpc::ServerUnaryReactor* GrpcTensorServer::Impl::Service::RecvTensor(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* reactor = new RecvReactor(impl_);
  impl_->serve(reactor, context, request, response);
  return reactor;
}

void GrpcTensorServer::Impl::serve(RecvReactor* reactor, grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  pb::RecvTensorRequest req;
  grpc::ByteBuffer copy(*request);  // shares the slices; the reader needs a mutable buffer
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !req.ParseFromZeroCopyStream(&reader)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "RecvTensor: malformed RecvTensorRequest"));
    return;
  }
  const TensorKey key{req.transfer_id(), req.step()};
  reactor->key = key;
  if (req.src_rank() != options.rank) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "RecvTensor " + to_string(key) + " asked rank " +
                                     std::to_string(req.src_rank()) + " but this server is rank " +
                                     std::to_string(options.rank)));
    return;
  }

  const auto now = Clock::now();
  Clock::time_point deadline = now + max_wait;
  const auto rpc_deadline = context->deadline();  // system_clock; max() when none
  if (rpc_deadline != std::chrono::system_clock::time_point::max()) {
    const auto left = rpc_deadline - std::chrono::system_clock::now();
    deadline = std::min(deadline, now + std::chrono::duration_cast<Clock::duration>(left));
  }

  std::unique_lock<std::mutex> lock(mu);
  if (closed) {
    lock.unlock();
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     "rank " + std::to_string(options.rank) + "'s tensor server is shutting down"));
    return;
  }
  if (auto it = published.find(key); it != published.end()) {
    response->Swap(&it->second);
    published.erase(it);
    lock.unlock();
    reactor->Finish(grpc::Status::OK);
    return;
  }
  if (waiting.count(key) != 0) {
    lock.unlock();
    reactor->Finish(
        grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                     "RecvTensor " + to_string(key) + ": another call is already waiting for it"));
    return;
  }
  if (deadline <= now) {
    lock.unlock();
    reactor->Finish(timed_out(key, options.rank, req.dst_rank(), Millis(0)));
    return;
  }
  waiting.emplace(key, Waiter{reactor, response, req.dst_rank(), now, deadline});
  deadlines.emplace(deadline, key);
  reactor->parked = true;
  const bool earliest = deadlines.begin()->second == key;
  lock.unlock();
  if (earliest) sweeper_cv.notify_one();
}

void GrpcTensorServer::Impl::cancelled(RecvReactor* reactor) {
  std::unique_lock<std::mutex> lock(mu);
  if (!reactor->parked) return;  // already finished by publish, the sweeper or shutdown
  auto it = waiting.find(reactor->key);
  deadlines.erase({it->second.deadline, it->first});
  waiting.erase(it);
  reactor->parked = false;
  lock.unlock();
  reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "RecvTensor cancelled"));
}

void GrpcTensorServer::Impl::sweep() {
  std::unique_lock<std::mutex> lock(mu);
  while (!closed) {
    if (deadlines.empty()) {
      sweeper_cv.wait(lock);
      continue;
    }
    const auto next = deadlines.begin()->first;
    if (Clock::now() < next) {
      sweeper_cv.wait_until(lock, next);
      continue;
    }
    const TensorKey key = deadlines.begin()->second;
    deadlines.erase(deadlines.begin());
    auto it = waiting.find(key);
    RecvReactor* reactor = it->second.reactor;
    const int dst_rank = it->second.dst_rank;
    const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - it->second.since);
    waiting.erase(it);
    reactor->parked = false;
    lock.unlock();
    reactor->Finish(timed_out(key, options.rank, dst_rank, waited));
    lock.lock();
  }
}

void GrpcTensorServer::Impl::shutdown() {
  std::vector<RecvReactor*> to_fail;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    closed = true;
    for (auto& [key, w] : waiting) {
      w.reactor->parked = false;
      to_fail.push_back(w.reactor);
    }
    waiting.clear();
    deadlines.clear();
  }
  sweeper_cv.notify_all();
  for (RecvReactor* r : to_fail) {
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "RecvTensor " + to_string(r->key) + ": rank " +
                               std::to_string(options.rank) + "'s tensor server shut down"));
  }
  if (sweeper.joinable()) sweeper.join();
  // Calls still in flight are cancelled after a short grace period.
  if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::map<TensorKey, grpc::ByteBuffer> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu);
  dropped.swap(published);
}

Result<std::unique_ptr<GrpcTensorServer>> GrpcTensorServer::start(
    const GrpcServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  impl->max_wait = options.max_wait.count() > 0 ? options.max_wait : default_timeout();
  RDMAFLOW_ASSIGN_OR_RETURN(std::string host,
                            grpc_common::listen_host(options.ifname, options.reach_address));

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(host + ":0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "grpc server start", options.rank,
                          "gRPC could not listen on " + host + ":0");
  }
  impl->address = host + ":" + std::to_string(port);
  Impl* raw = impl.get();
  impl->sweeper = std::thread([raw] { raw->sweep(); });
  RDMAFLOW_LOG_DEBUG("grpc tensor server of rank {} listening on {}", options.rank, impl->address);
  return std::unique_ptr<GrpcTensorServer>(new GrpcTensorServer(std::move(impl)));
}

GrpcTensorServer::GrpcTensorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcTensorServer::~GrpcTensorServer() {
  shutdown();
}

const std::string& GrpcTensorServer::address() const {
  return impl_->address;
}

int GrpcTensorServer::rank() const {
  return impl_->options.rank;
}

void GrpcTensorServer::shutdown() {
  impl_->shutdown();
}

size_t GrpcTensorServer::pending() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->published.size();
}

namespace {

// What publish_no_copy hands gRPC as the elements' slice's user data.
struct Release {
  std::function<void()> fn;
};

void run_release(void* p) {
  auto* r = static_cast<Release*>(p);
  if (r->fn) r->fn();
  delete r;
}

// The checks both publish forms make; returns the message prefix.
Result<std::string> checked_prefix(const TensorKey& key, DataType dtype,
                                   std::span<const int64_t> shape, const void* data, size_t bytes,
                                   const char* op, int rank) {
  RDMAFLOW_ASSIGN_OR_RETURN(size_t expected, grpc_wire::tensor_bytes(dtype, shape, op, rank));
  if (expected != bytes) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, rank,
                          to_string(key) + ": " + std::to_string(bytes) +
                              " bytes given, the shape holds " + std::to_string(expected));
  }
  if (bytes != 0 && data == nullptr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, rank, to_string(key) + ": data is null");
  }
  std::string prefix = grpc_wire::encode_response_prefix(dtype, shape, bytes);
  if (bytes > static_cast<size_t>(INT_MAX) - prefix.size()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, rank,
                          to_string(key) + ": " + std::to_string(bytes) +
                              " bytes exceed the 2 GiB limit of a protobuf message");
  }
  return prefix;
}

}  // namespace

// Hands `wire` to the call waiting for `key`, or keeps it for the next one.
// `wire` is destroyed (releasing borrowed memory) after the lock is dropped.
Status GrpcTensorServer::Impl::put(const TensorKey& key, grpc::ByteBuffer wire, const char* op) {
  std::unique_lock<std::mutex> lock(mu);
  if (closed) {
    return RDMAFLOW_ERROR(Code::kCancelled, op, options.rank,
                          to_string(key) + ": the tensor server was shut down");
  }
  if (published.count(key) != 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, options.rank,
                          to_string(key) + " is already published and not yet received");
  }
  auto it = waiting.find(key);
  if (it == waiting.end()) {
    published.emplace(key, std::move(wire));
    return Status::ok();
  }
  Waiter waiter = it->second;
  deadlines.erase({waiter.deadline, key});
  waiting.erase(it);
  waiter.reactor->parked = false;
  lock.unlock();
  waiter.response->Swap(&wire);
  waiter.reactor->Finish(grpc::Status::OK);
  return Status::ok();
}

Status GrpcTensorServer::publish(const TensorKey& key, DataType dtype,
                                 std::span<const int64_t> shape, const void* data, size_t bytes) {
  constexpr const char* kOp = "publish";
  const int rank = impl_->options.rank;
  RDMAFLOW_ASSIGN_OR_RETURN(std::string prefix,
                            checked_prefix(key, dtype, shape, data, bytes, kOp, rank));
  // The one copy of this side: the tensor, behind its message prefix, into the
  // buffer gRPC will send from.
  const size_t total = prefix.size() + bytes;
  auto* wire = static_cast<char*>(std::malloc(total));
  if (wire == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, kOp, rank,
                          to_string(key) + ": cannot allocate " + std::to_string(total) + " bytes");
  }
  std::memcpy(wire, prefix.data(), prefix.size());
  if (bytes != 0) std::memcpy(wire + prefix.size(), data, bytes);
  grpc::Slice slice(wire, total, std::free);
  return impl_->put(key, grpc::ByteBuffer(&slice, 1), kOp);
}

Status GrpcTensorServer::publish_no_copy(const TensorKey& key, DataType dtype,
                                         std::span<const int64_t> shape, const void* data,
                                         size_t bytes, std::function<void()> release) {
  constexpr const char* kOp = "publish_no_copy";
  const int rank = impl_->options.rank;
  auto prefix = checked_prefix(key, dtype, shape, data, bytes, kOp, rank);
  if (!prefix.is_ok() || bytes == 0) {
    if (release) release();  // nothing of `data` will be sent
    if (!prefix.is_ok()) return prefix.status();
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix->data(), prefix->size())};
  size_t count = 1;
  if (bytes != 0) {
    // From here on the slice owns `release`: it runs when gRPC and the table
    // have dropped their last reference.
    slices[count++] =
        grpc::Slice(const_cast<void*>(data), bytes, run_release, new Release{std::move(release)});
  }
  return impl_->put(key, grpc::ByteBuffer(slices, count), kOp);
}

}  // namespace rdmaflow
