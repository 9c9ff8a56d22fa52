// The gRPC baseline (docs/grpc-baseline.md): tensors moved the way
// TensorFlow's gRPC rendezvous moves them, the reference every rdmaflow
// transport is compared against (RDMAFLOW_TRANSPORT=grpc).
//
// Each process runs one GrpcTensorServer. Sending a tensor is `publish`: it is
// copied, already in its protobuf wire form, into the server's rendezvous
// table. Receiving it is a RecvTensor RPC from the receiver to the sender's
// server (GrpcTensorClient, one reused HTTP/2 channel per peer); the call waits
// on the server until the tensor is published, then carries it back and the
// server forgets it. The receiver copies tensor_content once, straight from
// gRPC's receive buffers into the destination.
//
//   // rank 1 (sender)                      // rank 0 (receiver)
//   auto server = GrpcTensorServer::start({.rank = 1});
//   // ... exchange server->address() ...   GrpcTensorClient client(0);
//                                           client.add_peer(1, address_of_rank_1);
//   server->publish({t, step}, DataType::kF32, {2, 3}, data, 24);
//                                           client.recv_tensor_into(1, {t, step}, dst, 24, 30s);
//
// Thread model: every method of both classes may be called from any thread.
// The server replies and the client completes async calls on gRPC's own
// threads; a callback must not block for long.
#pragma once

#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/channel.h"

namespace rdmaflow {

// The rendezvous key of one tensor: a transfer of the plan and a step.
struct TensorKey {
  uint64_t transfer_id = 0;
  uint64_t step = 0;

  auto operator<=>(const TensorKey&) const = default;
};

std::string to_string(const TensorKey& key);  // "transfer 3 step 17"

struct TensorMeta {
  DataType dtype = DataType::kF32;
  std::vector<int64_t> shape;
  size_t bytes = 0;  // of tensor_content = product(shape) * dtype_size(dtype)
};

// A received tensor that owns its bytes (allocated once, filled by the one copy
// out of gRPC's buffers).
struct ReceivedTensor {
  TensorMeta meta;
  std::unique_ptr<std::byte[]> storage;

  std::span<const std::byte> data() const { return {storage.get(), meta.bytes}; }
};

struct GrpcServerOptions {
  int rank = 0;
  // Interface name or literal address to listen on; empty means
  // RDMAFLOW_SOCKET_IFNAME, and if that is unset too, `reach_address`, then
  // 127.0.0.1. The port is always chosen by the kernel.
  std::string ifname;
  // The local address that reaches the other ranks' hosts
  // (TransportConfig::reach_address, from the bootstrap); empty on one host.
  std::string reach_address;
  // Longest a RecvTensor call waits on this server for its tensor, also for
  // calls without a deadline; calls with a shorter deadline end at it.
  // Zero means default_timeout() (RDMAFLOW_TIMEOUT_MS).
  Millis max_wait{0};
};

class GrpcTensorServer {
 public:
  // Listens and serves until shutdown(). Fails with kConnectionFailed when it
  // cannot listen, kInvalidArgument for a bad ifname.
  static Result<std::unique_ptr<GrpcTensorServer>> start(const GrpcServerOptions& options);

  ~GrpcTensorServer();  // shutdown()
  GrpcTensorServer(const GrpcTensorServer&) = delete;
  GrpcTensorServer& operator=(const GrpcTensorServer&) = delete;

  // "127.0.0.1:40123" or "[::1]:40123": what peers pass to GrpcTensorClient::add_peer.
  const std::string& address() const;
  int rank() const;

  // The send op: copies `bytes` from `data` into the table under `key` (encoded
  // once, as the RecvTensor reply), where one RecvTensor call takes it.
  // Refuses (kInvalidArgument) a key already published and not yet taken, a
  // shape whose size does not match `bytes`, and tensors over protobuf's 2 GiB
  // message limit; kCancelled after shutdown().
  Status publish(const TensorKey& key, DataType dtype, std::span<const int64_t> shape,
                 const void* data, size_t bytes);

  // The zero-copy send op, as TensorFlow's rendezvous holds a reference to a
  // tensor: the reply is sent straight from `data`, which must stay valid and
  // unchanged until `release` runs. `release` runs exactly once, on any thread,
  // once the bytes are no longer needed: after the reply went out, when the
  // tensor is dropped (shutdown), or before returning when the publish is
  // refused (same checks as publish) or `bytes` is 0.
  Status publish_no_copy(const TensorKey& key, DataType dtype, std::span<const int64_t> shape,
                         const void* data, size_t bytes, std::function<void()> release);

  // Tensors published and not yet taken.
  size_t pending() const;

  // Fails the waiting RecvTensor calls (UNAVAILABLE), stops serving and drops
  // the tensors not taken. Idempotent.
  void shutdown();

  struct Impl;

 private:
  explicit GrpcTensorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class GrpcTensorClient {
 public:
  explicit GrpcTensorClient(int rank);  // this process's rank (sent as dst_rank)
  ~GrpcTensorClient();
  GrpcTensorClient(const GrpcTensorClient&) = delete;
  GrpcTensorClient& operator=(const GrpcTensorClient&) = delete;

  // Creates the one channel to `peer_rank`'s server, reused by every later
  // call; it connects lazily (or in connect()). kInvalidArgument if the peer
  // already has a different address.
  Status add_peer(int peer_rank, const std::string& address);

  // Waits until the channel to `peer_rank` is connected, so that a first
  // measured call does not pay for the TCP and HTTP/2 handshakes.
  Status connect(int peer_rank, Millis timeout);

  // Pulls the tensor published under `key` by `peer_rank`; waits at most
  // `timeout` (kTimeout). A peer that is gone gives kPeerFailed.
  Result<ReceivedTensor> recv_tensor(int peer_rank, const TensorKey& key, Millis timeout);

  // Same, copying tensor_content straight into `dst` (kOutOfRange, and nothing
  // written, when it is larger than `capacity`). Returns the tensor's meta.
  Result<TensorMeta> recv_tensor_into(int peer_rank, const TensorKey& key, void* dst,
                                      size_t capacity, Millis timeout);

  // Asynchronous forms: `done` runs exactly once, on a gRPC thread (or inline
  // when the call cannot be started). `dst` must stay valid until then.
  using RecvDone = std::function<void(Result<ReceivedTensor>)>;
  using RecvIntoDone = std::function<void(Result<TensorMeta>)>;
  void recv_tensor_async(int peer_rank, const TensorKey& key, Millis timeout, RecvDone done);
  void recv_tensor_into_async(int peer_rank, const TensorKey& key, void* dst, size_t capacity,
                              Millis timeout, RecvIntoDone done);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmaflow
