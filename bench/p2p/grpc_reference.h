// bench/p2p's gRPC reference: tensors moved the way TensorFlow's gRPC
// rendezvous moves them (transport/grpc, docs/grpc-baseline.md), between the
// same two hosts as the transports, with the malloc tunables its own
// measurement asks for (p2p-grpc-reference re-executes itself with them unless
// --default-malloc). p2p runs it in a child process of each rank
// (bench/p2p/grpc_main.cc), so gRPC never lives in the measuring process.
//
// Latency: a ping-pong of tensors. Each side has its RecvTensor call for the
// peer's next tensor waiting on the peer's server before it publishes its own
// (as TensorFlow's receiver issues RecvTensor ahead of the send), so one way is
// publish -> reply -> the copy out of gRPC's buffers; one-way latency is half
// the round trip. Bandwidth: windows of `window` tensors published without a
// copy (publish_no_copy, as TensorFlow's rendezvous holds a reference) and
// pulled concurrently by the peer, which then publishes a 1-byte
// acknowledgement that rank 0 pulls before the next window.
#pragma once

#include <memory>
#include <string>

#include "bench/malloc_tunables.h"
#include "bench/p2p/harness.h"

namespace rdmaflow::bench {

class GrpcReference {
 public:
  // Starts this rank's server on `host` (rank 0's address for rank 0, the
  // address that reaches it for rank 1: the same interface the socket reference
  // uses) and connects to the peer's. Both ranks call it.
  static std::unique_ptr<GrpcReference> connect(int rank, Oob& oob, const std::string& host,
                                                size_t max_bytes);
  ~GrpcReference();

  Latency latency(int rank, Oob& oob, size_t size, const Options& o);
  double bandwidth(int rank, Oob& oob, size_t size, const Options& o);  // MB/s (rank 0)

  struct Impl;

 private:
  explicit GrpcReference(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sets GLIBC_TUNABLES to kMallocTunables and re-executes this program when it
// is not set yet (glibc reads it at start-up only). Returns only when nothing
// was to be done.
void ensure_malloc_tunables(char** argv);

}  // namespace rdmaflow::bench
