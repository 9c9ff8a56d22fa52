// Session::Engine: what moves a plan's tensors for one transport family.
//
//  - OneSidedEngine (runtime/session/session_one_sided.h): tcp, ucx, verbs. One
//    one-sided write with notify per transfer and step, credits, reads for
//    large dynamic tensors.
//  - GrpcEngine (runtime/session/session_grpc.h): the TensorFlow-style baseline. Send
//    publishes into the sender's rendezvous table, Recv pulls with a RecvTensor
//    RPC into the same slot the one-sided engine would have written.
//
// Session (runtime/session/session.cc) checks arguments and step order; an engine may
// assume them.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/session/session.h"
#include "runtime/session/session_layout.h"

namespace rdmaflow {

class Session::Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string name() const = 0;

  // Allocates the frames and exchanges what peers need (through `allgather`,
  // after the session checked the plan hash). `hash_record` is this rank's part
  // of that first exchange, already agreed on.
  virtual Status setup(const session_detail::SessionLayout& layout, const AllGather& allgather,
                       Millis timeout) = 0;

  // Base of frame 0 (frames follow at layout.frame_bytes).
  virtual uint8_t* frames() = 0;

  // A buffer of at least `bytes` for a dynamic output larger than its planned
  // size, for `step` (registered with the transport). Waits until the readers of
  // step - copies are done with it.
  virtual Result<SessionBuffer> overflow_buffer(size_t output_index, uint64_t step,
                                                size_t bytes) = 0;

  virtual Status begin_step(uint64_t step) = 0;
  // `payload` points into frames() (static: the planned buffer; dynamic with an
  // inline payload: the planned buffer + meta_bytes) or into the overflow buffer.
  virtual Status send(graph::TransferId t, uint64_t step, const void* payload, size_t bytes,
                      const std::vector<int64_t>& dims) = 0;
  virtual Result<RecvView> recv(graph::TransferId t, uint64_t step) = 0;
  virtual Status end_step(uint64_t step) = 0;
  virtual Status finish(const AllGather& allgather) = 0;
  virtual void add_stats(SessionStats& stats) const = 0;
};

}  // namespace rdmaflow
