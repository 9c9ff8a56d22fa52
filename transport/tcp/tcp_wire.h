// Wire format of the TCP backend (see docs/tcp_transport.md).
//
// A connection starts with a 16-byte Hello each way (connector first, then the
// acceptor's reply), after the job handshake (common/handshake.h). After that both
// directions carry frames: a fixed 72-byte
// header followed by `length` payload bytes. All integers are little endian
// (every supported host is).
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/remote_key.h"

namespace rdmaflow::tcp {

constexpr uint32_t kHelloMagic = 0x31484652;  // "RFH1"
constexpr uint32_t kFrameMagic = 0x31544652;  // "RFT1"
constexpr uint16_t kProtocolVersion = 2;      // 2: 128-bit key secrets (a 72-byte header)

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kProtocolVersion;
  uint16_t stream = 0;   // which of the connector's connections to this peer (0 = the channel)
  int32_t rank = -1;     // the sender's rank
  uint32_t streams = 0;  // connections per channel (RDMAFLOW_TCP_STREAMS); 0 means 1
};
static_assert(sizeof(Hello) == 16);

enum class FrameType : uint8_t {
  kWrite = 1,         // key/secret/offset/total name the target; payload = data
  kWriteAck = 2,      // op_id: the whole write is in the target's memory
  kWriteNack = 3,     // op_id, code; payload = reason text
  kReadRequest = 4,   // key/secret/offset name the source, value = bytes wanted
  kReadResponse = 5,  // op_id, offset = position in the reader's buffer; payload = data
  kReadNack = 6,      // op_id, code; payload = reason text
  kMessage = 7,       // payload = message bytes
};

enum FrameFlags : uint8_t {
  kFlagFirst = 1,      // first chunk of a write/read response
  kFlagLast = 2,       // last chunk of a write/read response
  kFlagHasNotify = 4,  // write: push `value` to the receiver's inbox after the data
  kFlagShare = 8,      // write: a share of a striped write; `value` and `total` are the
                       // whole write's offset and length, which the first chunk checks
  kFlagNoAck = 16,     // write (Channel::post_write): no ACK, the initiator completed it
                       // when sent; a refusal's NACK echoes the flag and fails the
                       // initiator's channel
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint16_t code = 0;    // NACK: rdmaflow::Code of the refusal
  uint64_t length = 0;  // payload bytes following this header
  uint64_t op_id = 0;   // initiator's operation id, echoed in replies
  uint64_t key_id = 0;  // write / read request: the grant
  KeySecret secret;     // write / read request: the grant's secret
  uint64_t offset = 0;  // write / read request: offset in the grant; read response: in the buffer
  uint64_t value = 0;   // write: notify value; read request: bytes wanted
  uint64_t total = 0;   // write: bytes of the whole operation (checked on the first chunk)
};
static_assert(sizeof(FrameHeader) == 72);

// Limits a receiver enforces; a header beyond them is a protocol error.
constexpr uint64_t kMaxChunkPayload = 64ull << 20;  // one write / read-response frame
constexpr uint64_t kMaxMessageBytes = 64ull << 20;  // one control message
constexpr uint64_t kMaxReasonBytes = 1024;          // NACK reason text
constexpr uint64_t kMaxReadRequest = 1ull << 40;    // one read

}  // namespace rdmaflow::tcp
