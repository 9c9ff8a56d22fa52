// What verbs peers say to each other besides one-sided data.
//
// Hello: the rdma_cm private data of the connect request and of the accept.
//   u32 magic 'RFV1' | u16 version | u16 flags | i32 rank | u32 credits |
//   u32 msg_size | u32 ring_slots | u32 ring_rkey | u64 ring_addr   (36 bytes)
// `credits`: receive buffers the sender of the hello reserved for its peer;
// `msg_size`: size of each of those buffers (a SEND may not exceed it);
// ring_*: the notify ring (see notify.h). The private data of an IB/RoCE CM
// message arrives zero-padded (to 56 / 196 bytes), so trailing bytes are ignored.
//
// Every SEND starts with an 8-byte header:
//   u8 type (1 data, 2 credit) | u8 flags (bit 0: last fragment) | u16 zero | u32 credits
// `credits` returns receive buffers to the peer. A message larger than one
// buffer is split into fragments on the (ordered) RC queue pair and joined again.
// All integers little endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "allocator/status.h"

namespace rdmaflow::verbs {

inline constexpr uint32_t kHelloMagic = 0x31564652;  // "RFV1"
inline constexpr uint16_t kHelloVersion = 1;
inline constexpr size_t kHelloSize = 36;
// librdmacm allows 56 bytes of private data in a connect request (RDMA_PS_TCP).
inline constexpr size_t kMaxConnectPrivateData = 56;
inline constexpr uint32_t kMinMsgSize = 64;
inline constexpr uint32_t kMaxMsgSize = 1u << 24;

struct Hello {
  int32_t rank = -1;
  uint32_t credits = 0;
  uint32_t msg_size = 0;
  uint32_t ring_slots = 0;
  uint32_t ring_rkey = 0;
  uint64_t ring_addr = 0;

  std::vector<uint8_t> encode() const;
  // Validates everything the channel relies on; kProtocolError names what is wrong.
  static Result<Hello> decode(std::span<const uint8_t> bytes);
};

enum class MsgType : uint8_t { kData = 1, kCredit = 2 };
inline constexpr uint8_t kFlagLastFragment = 1;
inline constexpr size_t kMsgHeaderSize = 8;

struct MsgHeader {
  MsgType type = MsgType::kData;
  bool last = true;
  uint32_t credits = 0;

  void encode(uint8_t* out) const;  // writes kMsgHeaderSize bytes
  static Result<MsgHeader> decode(std::span<const uint8_t> bytes, int peer);
};

// [offset, length) pieces of a `total`-byte message for buffers holding
// `max_payload` bytes after the header. An empty message is one empty fragment.
std::vector<std::pair<size_t, size_t>> plan_fragments(size_t total, size_t max_payload);

// Joins fragments; refuses messages beyond `max_message` bytes.
class MessageReassembler {
 public:
  explicit MessageReassembler(size_t max_message) : max_(max_message) {}
  // Returns the whole message when `last`, else nullopt.
  Result<std::optional<std::vector<uint8_t>>> add(std::span<const uint8_t> payload, bool last,
                                                  int peer);
  size_t pending_bytes() const { return partial_.size(); }

 private:
  size_t max_;
  std::vector<uint8_t> partial_;
};

// Largest control message the verbs backend accepts (fragments joined).
inline constexpr size_t kMaxMessageBytes = size_t{256} << 20;

}  // namespace rdmaflow::verbs
