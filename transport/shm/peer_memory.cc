#include "transport/shm/peer_memory.h"

#include <string>

namespace rdmaflow::shm {

Status PeerMemory::refuse(const char* op, uint64_t offset, uint64_t len) const {
  if (!mapped()) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer_, "no memory of the peer is mapped here");
  }
  if (covers(offset, len)) {  // only a word store gets here with a covered range
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_,
                          "word at offset " + std::to_string(offset) + " is not 8-byte aligned");
  }
  return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer_,
                        "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                            " exceeds the " + std::to_string(length_) +
                            " bytes of the peer's memory mapped here");
}

}  // namespace rdmaflow::shm
