// GrpcTensorClient: RecvTensor calls over one reused channel per peer.
//
// Calls go through gRPC's generic stub with raw byte buffers, as TensorFlow's
// GrpcRemoteWorker does, so the reply is not parsed into a protobuf message
// (which would copy tensor_content into a std::string) but decoded by
// tensor_wire.h straight from gRPC's receive slices into the destination.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "common/log.h"
#include "transport/grpc/grpc_common.h"
#include "transport/grpc/grpc_tensor.h"
#include "transport/grpc/tensor_service.pb.h"
#include "transport/grpc/tensor_wire.h"

namespace rdmaflow {
namespace {

namespace pb = ::rdmaflow::grpc_tensor;
constexpr const char* kRecvOp = "recv_tensor";
// How long a blocking call waits beyond its timeout for gRPC to report it.
constexpr Millis kGrace{5000};

struct Peer {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
};

// One RecvTensor call in flight; kept alive by the completion callback.
struct Call {
  std::shared_ptr<Peer> peer;  // keeps the channel alive
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};

// `done` gets the outcome and, when it is OK, the reply to decode.
using CallDone = std::function<void(Status, grpc::ByteBuffer*)>;

}  // namespace

struct GrpcTensorClient::Impl {
  explicit Impl(int r) : rank(r) {}

  Result<std::shared_ptr<Peer>> find_peer(int peer_rank, const char* op) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = peers.find(peer_rank);
    if (it == peers.end()) {
      return RDMAFLOW_ERROR(Code::kNotFound, op, peer_rank,
                            "no address for this peer (GrpcTensorClient::add_peer)");
    }
    return it->second;
  }

  void start(int peer_rank, const TensorKey& key, Millis timeout, CallDone done);

  const int rank;
  std::mutex mu;
  std::map<int, std::shared_ptr<Peer>> peers;
};

void GrpcTensorClient::Impl::start(int peer_rank, const TensorKey& key, Millis timeout,
                                   CallDone done) {
  auto peer = find_peer(peer_rank, kRecvOp);
  if (!peer.is_ok()) {
    done(peer.status(), nullptr);
    return;
  }
  auto call = std::make_shared<Call>();
  call->peer = *peer;
  call->context.set_deadline(std::chrono::system_clock::now() + timeout);

  pb::RecvTensorRequest req;
  req.set_transfer_id(key.transfer_id);
  req.set_step(key.step);
  req.set_src_rank(peer_rank);
  req.set_dst_rank(rank);
  bool own_buffer = false;
  grpc::Status st =
      grpc::SerializationTraits<pb::RecvTensorRequest>::Serialize(req, &call->request, &own_buffer);
  if (!st.ok()) {
    done(grpc_common::from_grpc(st, kRecvOp, peer_rank, "RecvTensor " + to_string(key)), nullptr);
    return;
  }

  std::string context = "RecvTensor " + to_string(key) + " from rank " + std::to_string(peer_rank) +
                        " at " + call->peer->address + " (timeout " +
                        std::to_string(timeout.count()) + " ms)";
  call->peer->stub->UnaryCall(
      &call->context, grpc_wire::kRecvTensorMethod, grpc::StubOptions(), &call->request,
      &call->response,
      [call, peer_rank, context = std::move(context), done = std::move(done)](grpc::Status s) {
        if (!s.ok()) {
          done(grpc_common::from_grpc(s, kRecvOp, peer_rank, context), nullptr);
        } else {
          done(Status::ok(), &call->response);
        }
      });
}

namespace {

// Decodes a reply, copying tensor_content to sink(size).
Result<TensorMeta> decode(grpc::ByteBuffer* response, const grpc_wire::ContentSink& sink,
                          int peer_rank) {
  grpc::ProtoBufferReader reader(response);
  if (!reader.status().ok()) {
    return RDMAFLOW_ERROR(Code::kProtocolError, kRecvOp, peer_rank,
                          "unreadable RecvTensor reply: " + reader.status().error_message());
  }
  return grpc_wire::decode_response(&reader, sink, kRecvOp, peer_rank);
}

grpc_wire::ContentSink into(void* dst, size_t capacity, int peer_rank, const TensorKey& key) {
  return [=](size_t bytes) -> Result<void*> {
    if (bytes > capacity) {
      return RDMAFLOW_ERROR(Code::kOutOfRange, kRecvOp, peer_rank,
                            to_string(key) + " has " + std::to_string(bytes) +
                                " bytes, more than the destination's " + std::to_string(capacity));
    }
    return dst;
  };
}

grpc_wire::ContentSink allocate(ReceivedTensor* t) {
  return [t](size_t bytes) -> Result<void*> {
    t->storage = std::make_unique_for_overwrite<std::byte[]>(bytes);
    return static_cast<void*>(t->storage.get());
  };
}

// A blocking call's rendezvous with its completion. The completion decodes
// under `mu`, and not at all once the caller gave up, so a caller that returns
// never has its destination written afterwards.
template <typename T>
struct Waiting {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  bool abandoned = false;
  std::optional<Result<T>> result;
};

template <typename T>
Result<T> wait_for(const std::shared_ptr<Waiting<T>>& w, int peer_rank, const TensorKey& key,
                   Millis timeout) {
  std::unique_lock<std::mutex> lock(w->mu);
  if (w->cv.wait_for(lock, timeout + kGrace, [&] { return w->finished; })) {
    return std::move(*w->result);
  }
  w->abandoned = true;
  return RDMAFLOW_ERROR(Code::kTimeout, kRecvOp, peer_rank,
                        "RecvTensor " + to_string(key) +
                            ": gRPC did not complete the call within " +
                            std::to_string((timeout + kGrace).count()) + " ms");
}

}  // namespace

GrpcTensorClient::GrpcTensorClient(int rank) : impl_(std::make_unique<Impl>(rank)) {}

GrpcTensorClient::~GrpcTensorClient() = default;

Status GrpcTensorClient::add_peer(int peer_rank, const std::string& address) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (auto it = impl_->peers.find(peer_rank); it != impl_->peers.end()) {
    if (it->second->address == address) return Status::ok();
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "add_peer", peer_rank,
                          "already at " + it->second->address + ", not " + address);
  }
  if (address.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "add_peer", peer_rank, "empty address");
  }
  auto peer = std::make_shared<Peer>();
  peer->address = address;
  peer->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                            grpc_common::channel_arguments());
  if (!peer->channel) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "add_peer", peer_rank,
                          "gRPC could not create a channel to " + address);
  }
  peer->stub = std::make_unique<grpc::GenericStub>(peer->channel);
  impl_->peers.emplace(peer_rank, std::move(peer));
  return Status::ok();
}

Status GrpcTensorClient::connect(int peer_rank, Millis timeout) {
  RDMAFLOW_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer, impl_->find_peer(peer_rank, "connect"));
  const auto deadline = std::chrono::system_clock::now() + timeout;
  grpc_connectivity_state state = peer->channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_SHUTDOWN) break;
    if (!peer->channel->WaitForStateChange(state, deadline)) break;
    state = peer->channel->GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return Status::ok();
  const bool failing = state == GRPC_CHANNEL_TRANSIENT_FAILURE;
  return RDMAFLOW_ERROR(failing ? Code::kConnectionFailed : Code::kTimeout, "connect", peer_rank,
                        std::string(failing ? "cannot connect" : "not connected") + " to " +
                            peer->address + " within " + std::to_string(timeout.count()) + " ms");
}

void GrpcTensorClient::recv_tensor_async(int peer_rank, const TensorKey& key, Millis timeout,
                                         RecvDone done) {
  impl_->start(peer_rank, key, timeout,
               [peer_rank, done = std::move(done)](Status s, grpc::ByteBuffer* response) {
                 if (!s.is_ok()) return done(std::move(s));
                 ReceivedTensor t;
                 auto meta = decode(response, allocate(&t), peer_rank);
                 if (!meta.is_ok()) return done(meta.status());
                 t.meta = std::move(meta).value();
                 done(std::move(t));
               });
}

void GrpcTensorClient::recv_tensor_into_async(int peer_rank, const TensorKey& key, void* dst,
                                              size_t capacity, Millis timeout, RecvIntoDone done) {
  impl_->start(peer_rank, key, timeout,
               [peer_rank, key, dst, capacity, done = std::move(done)](Status s,
                                                                       grpc::ByteBuffer* response) {
                 if (!s.is_ok()) return done(std::move(s));
                 done(decode(response, into(dst, capacity, peer_rank, key), peer_rank));
               });
}

Result<ReceivedTensor> GrpcTensorClient::recv_tensor(int peer_rank, const TensorKey& key,
                                                     Millis timeout) {
  auto w = std::make_shared<Waiting<ReceivedTensor>>();
  impl_->start(peer_rank, key, timeout, [w, peer_rank](Status s, grpc::ByteBuffer* response) {
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->abandoned) return;
    if (!s.is_ok()) {
      w->result.emplace(std::move(s));
    } else {
      ReceivedTensor t;
      auto meta = decode(response, allocate(&t), peer_rank);
      if (meta.is_ok()) {
        t.meta = std::move(meta).value();
        w->result.emplace(std::move(t));
      } else {
        w->result.emplace(meta.status());
      }
    }
    w->finished = true;
    w->cv.notify_all();
  });
  return wait_for(w, peer_rank, key, timeout);
}

Result<TensorMeta> GrpcTensorClient::recv_tensor_into(int peer_rank, const TensorKey& key,
                                                      void* dst, size_t capacity, Millis timeout) {
  auto w = std::make_shared<Waiting<TensorMeta>>();
  impl_->start(
      peer_rank, key, timeout,
      [w, peer_rank, key, dst, capacity](Status s, grpc::ByteBuffer* response) {
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->abandoned) return;
        if (!s.is_ok()) {
          w->result.emplace(std::move(s));
        } else {
          w->result.emplace(decode(response, into(dst, capacity, peer_rank, key), peer_rank));
        }
        w->finished = true;
        w->cv.notify_all();
      });
  return wait_for(w, peer_rank, key, timeout);
}

}  // namespace rdmaflow
