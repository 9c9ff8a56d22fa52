// GrpcEngine: the Session over the gRPC baseline (transport/grpc), the way
// TensorFlow's gRPC rendezvous moves tensors: the Send op publishes the tensor
// into the sender's table (one copy, already in wire form), the Recv is a
// RecvTensor RPC from the receiver, issued when the step begins (TensorFlow
// schedules its Recv ops, which have no inputs, at once) and copied straight
// from gRPC's buffers into the same slot the one-sided engine writes. Same
// plan, same frames, same executor: only the transport differs.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/session/session_engine.h"
#include "transport/grpc/grpc_tensor.h"

namespace rdmaflow::session_detail {

class GrpcEngine final : public Session::Engine {
 public:
  // `reach_address`: where the server listens when RDMAFLOW_SOCKET_IFNAME is
  // unset (Bootstrap::transport_config(), as the socket backends listen).
  GrpcEngine(int rank, int world, std::string reach_address);
  ~GrpcEngine() override;

  std::string name() const override { return "grpc"; }
  Status setup(const SessionLayout& layout, const AllGather& allgather, Millis timeout) override;
  uint8_t* frames() override { return frames_.get(); }
  Result<SessionBuffer> overflow_buffer(size_t output_index, uint64_t step, size_t bytes) override;
  Status begin_step(uint64_t step) override;
  Status send(graph::TransferId t, uint64_t step, const void* payload, size_t bytes,
              const std::vector<int64_t>& dims) override;
  Result<RecvView> recv(graph::TransferId t, uint64_t step) override;
  Status end_step(uint64_t step) override;
  Status finish(const AllGather& allgather) override;
  void add_stats(SessionStats& stats) const override;

 private:
  struct Incoming {  // one RecvTensor call of one transfer and step
    uint64_t step = 0;
    bool done = true;
    Status status;
    RecvView view;
    std::shared_ptr<ReceivedTensor> owned;  // dynamic tensors own their bytes
  };
  struct Core {
    std::mutex mu;
    std::condition_variable cv;
    std::map<graph::TransferId, Incoming> in;
    SessionStats stats;
  };
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };

  int rank_;
  int world_;
  std::string reach_address_;
  const SessionLayout* layout_ = nullptr;
  Millis timeout_{30000};
  std::unique_ptr<uint8_t, FreeDeleter> frames_;
  std::map<std::pair<size_t, uint32_t>, std::unique_ptr<uint8_t, FreeDeleter>> overflow_;
  std::map<std::pair<size_t, uint32_t>, size_t> overflow_cap_;
  std::unique_ptr<GrpcTensorServer> server_;
  std::unique_ptr<GrpcTensorClient> client_;
  std::shared_ptr<Core> core_ = std::make_shared<Core>();
};

}  // namespace rdmaflow::session_detail
