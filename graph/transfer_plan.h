// TransferPlan: everything an executor needs, decided before the first step,
// to move every cross-rank tensor with one one-sided write into memory the
// receiver prepared (docs/graph-plans.md).
//
// Memory. Each rank registers one arena of `copies` frames of `frame_bytes`.
// Step s uses frame (s mod copies): a buffer planned at `offset` lives at
// offset + (s mod copies) * frame_bytes. Within a frame, buffers whose
// lifetimes within a step do not overlap share bytes.
//
// A step of transfer t (static shape):
//  - the producer on the source rank writes its output straight into the
//    output buffer `send_buffer` (registered memory; no staging copy);
//  - the Send writes `bytes` from there into the receiver's slot `recv_slot`
//    with notify = make_notify(t, step);
//  - the Recv waits for that notify; readers use the slot in place.
// A dynamic-shape transfer uses the same slot and buffer, which start with a
// `meta_bytes` header (DynamicHeader in docs/graph-plans.md) followed by
// `size_hint` payload bytes: when the payload fits, header and payload go in
// that one write; otherwise only the header goes and the receiver reads the
// payload from the sender's RemoteKey in the header into memory it allocates.
//
// Flow control: the sender may write step s only once the receiver has
// reported step s - copies finished (one credit per peer and step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "graph/ir.h"
#include "graph/liveness.h"
#include "graph/partition.h"

namespace rdmaflow::graph {

// notify = transfer id in the high 32 bits, step modulo 2^32 in the low 32.
constexpr uint64_t make_notify(TransferId transfer, uint64_t step) {
  return (static_cast<uint64_t>(transfer) << 32) | (step & 0xffffffffu);
}
constexpr TransferId notify_transfer(uint64_t notify) {
  return static_cast<TransferId>(notify >> 32);
}
constexpr uint32_t notify_step(uint64_t notify) {
  return static_cast<uint32_t>(notify & 0xffffffffu);
}

struct PlanOptions {
  uint32_t pipeline_depth = 2;            // frames (slots per transfer); 1..64
  uint64_t alignment = 64;                // of every buffer; a power of two, 1..2^20
  uint64_t dynamic_size_hint = 64 << 10;  // payload bytes for dynamic tensors without size_hint
  uint64_t meta_bytes = 1024;             // dynamic header; a multiple of 8, 64..2^20
  bool reuse = true;                      // share bytes between disjoint lifetimes

  bool operator==(const PlanOptions&) const = default;
};

// A range of a rank's arena (in frame 0; add k * frame_bytes for frame k).
struct Region {
  uint64_t offset = 0;
  uint64_t size = 0;       // bytes the plan reserves (>= the tensor's bytes)
  uint64_t alignment = 0;  // offset is a multiple of it

  bool operator==(const Region&) const = default;
};

struct TransferSpec {
  TransferId id = 0;
  std::string tensor;
  DataType dtype = DataType::kF32;
  Shape shape;
  int src_rank = 0;
  int dst_rank = 0;
  std::string producer;  // the op on src_rank that writes the tensor
  std::string send_op;   // op names in the ranks' schedules
  std::string recv_op;
  bool dynamic = false;
  uint64_t bytes = 0;        // static: exact bytes per step; dynamic: the size hint
  uint32_t slots = 1;        // pipelining depth: slot copies on the receiver
  Region recv_slot;          // receiver's slot, frame 0
  uint64_t slot_stride = 0;  // receiver's frame_bytes: slot k at recv_slot.offset + k * stride
  Region send_buffer;        // sender's output buffer, frame 0
  uint64_t send_stride = 0;  // sender's frame_bytes
  uint64_t meta_bytes = 0;   // dynamic: header bytes before the payload (0 when static)

  bool operator==(const TransferSpec&) const = default;
};

enum class OpKind : uint8_t { kCompute, kSend, kRecv };

struct ScheduledOp {
  std::string name;
  std::string type;
  OpKind kind = OpKind::kCompute;
  int64_t transfer = -1;  // Send / Recv: its transfer id

  bool operator==(const ScheduledOp&) const = default;
};

// A registered buffer of a rank and when, within a step, it is in use:
// [live_begin, live_end) in positions of the rank's schedule (live_begin may be
// -1: written before the first op may run).
struct PlannedBuffer {
  BufferKind kind = BufferKind::kOutput;  // output (sender side) or slot (receiver)
  std::string tensor;
  std::string op;                     // kOutput: the producer that writes it; kSlot: the Recv
  std::vector<TransferId> transfers;  // kOutput: every transfer sending it; kSlot: one
  bool dynamic = false;
  Region region;
  int32_t live_begin = 0;
  int32_t live_end = 0;

  bool operator==(const PlannedBuffer&) const = default;
};

struct RankPlan {
  int rank = 0;
  std::vector<ScheduledOp> schedule;   // execution order within a step
  std::vector<TransferId> sends;       // transfers out, by id
  std::vector<TransferId> recvs;       // transfers in, by id
  std::vector<PlannedBuffer> buffers;  // outputs by tensor, then slots by transfer
  uint64_t frame_bytes = 0;            // one frame, with reuse
  uint64_t frame_bytes_without_reuse = 0;
  uint32_t copies = 1;            // frames registered (= pipeline depth)
  uint64_t registered_bytes = 0;  // frame_bytes * copies
  uint64_t registered_bytes_without_reuse = 0;
  uint64_t bytes_out_per_step = 0;  // static bytes + dynamic size hints
  uint64_t bytes_in_per_step = 0;
  uint32_t static_out = 0, dynamic_out = 0, static_in = 0, dynamic_in = 0;

  bool operator==(const RankPlan&) const = default;
};

struct TransferPlan {
  std::string graph_name;
  uint64_t graph_hash = 0;  // graph_fingerprint(graph, placement) (graph/partition.h)
  int num_ranks = 0;
  PlanOptions options;
  std::vector<TransferSpec> transfers;  // indexed by TransferId
  std::vector<RankPlan> ranks;          // indexed by rank

  bool operator==(const TransferPlan&) const = default;
};

}  // namespace rdmaflow::graph
