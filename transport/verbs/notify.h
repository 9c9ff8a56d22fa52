// How a 64-bit notify travels in a 32-bit immediate.
//
// A write with notify is posted as RDMA_WRITE_WITH_IMM; its receive completion
// at the peer appears only after every byte of the write is in the peer's
// memory, so the notify is delivered exactly when the contract requires.
//
//   imm bit 31 = 0   the notify itself (values below 2^31: one work request)
//   imm bit 31 = 1   bits 0..30 index a slot of the receiver's notify ring, a
//                    per-channel array of 64-bit values (its address and rkey
//                    come in the connection hello). The sender first RDMA-writes
//                    the value into that slot, then posts the WRITE_WITH_IMM on
//                    the same RC queue pair; RC executes them in order, so the
//                    slot holds the value when the immediate arrives.
//
// The ring has as many slots as receive credits the receiver grants (its
// window). A ring notify also consumes one credit, and credits return only
// after the receiver has read the slot, so by the time the sender comes back to
// slot s, the previous value in s has been consumed: at most `window` credit-
// consuming operations are ever unacknowledged, and slots are handed out in
// order. The sender's staging copy of the value (the RDMA write's source) has
// the same lifetime argument.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"

namespace rdmaflow::verbs {

inline constexpr uint32_t kImmRingFlag = 1u << 31;
inline constexpr uint64_t kMaxInlineNotify = kImmRingFlag - 1;

struct EncodedNotify {
  uint32_t imm = 0;                   // host order; post as htonl(imm)
  std::optional<uint32_t> ring_slot;  // set when the value goes through the ring
};

class NotifyEncoder {
 public:
  explicit NotifyEncoder(uint32_t ring_slots) : ring_slots_(ring_slots) {}
  uint32_t ring_slots() const { return ring_slots_; }

  // Slot handed out by the next ring encoding.
  uint32_t next_slot() const { return next_slot_; }

  // kInvalidArgument for a value >= 2^31 when the peer offered no ring.
  Result<EncodedNotify> encode(uint64_t value);

 private:
  uint32_t ring_slots_;
  uint32_t next_slot_ = 0;
};

struct DecodedImm {
  std::optional<uint32_t> ring_slot;  // read the value from this slot
  uint64_t value = 0;                 // the notify when ring_slot is empty
};

// kProtocolError when the slot lies outside a ring of `ring_slots` entries.
Result<DecodedImm> decode_imm(uint32_t imm, uint32_t ring_slots, int peer);

}  // namespace rdmaflow::verbs
