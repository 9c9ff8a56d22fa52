// What verbs peers say to each other besides one-sided data.
//
// Connection setup runs the job handshake (common/handshake.h, label "verbs")
// on rdma_cm's messages and the queue pair's first SEND:
//   connect request private data   the handshake's hello (48 bytes)
//   accept private data            the challenge (72 bytes) | the acceptor's Hello
//   first SEND of the connector    type 6 (auth): the proof (32 bytes) | its Hello
// The acceptor's queue pair refuses every RDMA write and read (no remote access)
// until that proof checked; it reads nothing else from the peer before.
//
// Hello: the connection parameters each side grants the other.
//   u32 magic 'RFV1' | u16 version | u16 flags | i32 rank | u32 credits |
//   u32 msg_size | u32 ring_slots | u32 ring_rkey | u64 ring_addr   (36 bytes)
// `credits`: receive buffers the sender of the hello reserved for its peer;
// `msg_size`: size of each of those buffers (a SEND may not exceed it);
// ring_*: the notify ring (see notify.h). The private data of an IB/RoCE CM
// message arrives zero-padded (to 56 / 196 bytes), so trailing bytes are ignored.
//
// Every SEND starts with an 8-byte header:
//   u8 type | u8 flags (bit 0: last fragment) | u16 zero | u32 credits
// `credits` returns receive buffers to the peer. Types:
//   1 data         a user message (fragment); larger than one buffer -> several
//                  fragments on the (ordered) RC queue pair, joined again
//   2 credit       credits only, no payload
//   3 key check    "may I use this RemoteKey?" (KeyCheck), before the first
//                  one-sided access with a key on a channel
//   4 key verdict  the answer (KeyVerdict): ok, not found, out of range
//   5 key revoked  the grant behind key_id was revoked (KeyRevoked)
//   6 auth         the connector's handshake proof and Hello (AuthProof): the
//                  first message on a connection, and only there
// The key messages let the target refuse a forged, unknown, revoked or inflated
// key before any byte moves: the NIC only knows the slab's rkey. All integers
// little endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow::verbs {

inline constexpr uint32_t kHelloMagic = 0x31564652;  // "RFV1"
inline constexpr uint16_t kHelloVersion = 1;
inline constexpr size_t kHelloSize = 36;
// librdmacm allows 56 bytes of private data in a connect request (RDMA_PS_TCP).
inline constexpr size_t kMaxConnectPrivateData = 56;
inline constexpr uint32_t kMinMsgSize = 256;  // room for a KeyVerdict
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

enum class MsgType : uint8_t {
  kData = 1,
  kCredit = 2,
  kKeyCheck = 3,
  kKeyVerdict = 4,
  kKeyRevoked = 5,
  kAuth = 6
};
inline constexpr uint8_t kFlagLastFragment = 1;
inline constexpr size_t kMsgHeaderSize = 8;

struct MsgHeader {
  MsgType type = MsgType::kData;
  bool last = true;
  uint32_t credits = 0;

  void encode(uint8_t* out) const;  // writes kMsgHeaderSize bytes
  static Result<MsgHeader> decode(std::span<const uint8_t> bytes, int peer);
};

// The identity of a RemoteKey as the initiator presents it (everything the
// target must vouch for).
struct KeyClaim {
  uint64_t key_id = 0;
  KeySecret secret;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  auto operator<=>(const KeyClaim&) const = default;
};

// u64 request | u64 key_id | u64 secret lo | u64 secret hi | u64 addr | u64 length | u32 rkey
struct KeyCheck {
  uint64_t request = 0;
  KeyClaim claim;
  std::vector<uint8_t> encode() const;
  static Result<KeyCheck> decode(std::span<const uint8_t> payload, int peer);
};

// u64 request | u8 code (rdmaflow::Code) | u32 rkey | reason text (at most
// kMaxVerdictReason bytes). `rkey`: the memory window the target bound for this
// grant on this queue pair (use it instead of the key's slab rkey); 0: none.
inline constexpr size_t kMaxVerdictReason = 200;
struct KeyVerdict {
  uint64_t request = 0;
  Code code = Code::kOk;
  uint32_t rkey = 0;
  std::string reason;
  std::vector<uint8_t> encode() const;  // truncates the reason
  static Result<KeyVerdict> decode(std::span<const uint8_t> payload, int peer);
};

// u64 key_id
struct KeyRevoked {
  uint64_t key_id = 0;
  std::vector<uint8_t> encode() const;
  static Result<KeyRevoked> decode(std::span<const uint8_t> payload, int peer);
};

// The connector's first SEND (after the 8-byte header): u8 proof[32] | Hello.
inline constexpr size_t kProofSize = 32;  // auth::kProofBytes
inline constexpr size_t kAuthProofSize = kProofSize + kHelloSize;
struct AuthProof {
  std::span<const uint8_t> proof;  // kProofSize bytes, into the decoded payload
  Hello hello;
  static std::vector<uint8_t> encode(std::span<const uint8_t> proof, const Hello& hello);
  static Result<AuthProof> decode(std::span<const uint8_t> payload, int peer);
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
