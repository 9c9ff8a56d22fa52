#include "transport/verbs/notify.h"

namespace rdmaflow::verbs {

Result<EncodedNotify> NotifyEncoder::encode(uint64_t value) {
  EncodedNotify out;
  if (value <= kMaxInlineNotify) {
    out.imm = static_cast<uint32_t>(value);
    return out;
  }
  if (ring_slots_ == 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "encode notify", -1,
                          "notify " + std::to_string(value) +
                              " needs the peer's notify ring, but the peer offered none");
  }
  uint32_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % ring_slots_;
  out.imm = kImmRingFlag | slot;
  out.ring_slot = slot;
  return out;
}

Result<DecodedImm> decode_imm(uint32_t imm, uint32_t ring_slots, int peer) {
  DecodedImm out;
  if ((imm & kImmRingFlag) == 0) {
    out.value = imm;
    return out;
  }
  uint32_t slot = imm & ~kImmRingFlag;
  if (slot >= ring_slots) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive notify", peer,
                          "immediate names notify ring slot " + std::to_string(slot) +
                              " but the ring has " + std::to_string(ring_slots) + " slots");
  }
  out.ring_slot = slot;
  return out;
}

}  // namespace rdmaflow::verbs
