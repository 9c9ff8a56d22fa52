// Wire format of the UCX backend: every message is one UCP active message
// (AM id kAmId) with a fixed 72-byte header; the header's type says what it is
// and the AM data carries the payload (message bytes, write payload, worker
// address, refusal list). See docs/ucx.md, "Wire protocol".
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "transport/remote_key.h"

namespace rdmaflow::ucx {

constexpr uint16_t kAmId = 0x52;  // 'R'

enum class MsgType : uint8_t {
  kHello = 1,       // connector -> acceptor. id: connector's channel id, value: connector's
                    // rank. data: connector's address string (identity + worker address),
                    // then the job handshake's hello (auth::kHelloBytes, common/handshake.h).
  kHelloAck = 2,    // acceptor -> connector. id: acceptor's channel id. data: the handshake's
                    // challenge (auth::kChallengeBytes).
  kMessage = 3,     // ordered. data: the message.
  kWrite = 4,       // ordered. key_id, secret, offset, length, [value = notify]. data: payload
                    // (eager, or rendezvous pulled by the receiver straight into the target).
  kNotify = 5,      // ordered. key_id, secret, offset, length, value = notify; the payload was
                    // already put with ucp_put_nbx and flushed.
  kAck = 6,         // offset..length: the ordered sequence numbers [from, upto) the receiver
                    // has applied. data: refusals (seq, code, reason) in that range.
  kReadReq = 7,     // id: op id. key_id, secret, offset, length.
  kReadResp = 8,    // id: op id. code != 0: refused, data = reason; else data = the bytes.
  kKeyQuery = 9,    // id: key id, secret. "May I put/get with this key?"
  kKeyReply = 10,   // id: key id. code, value = grant address, length = grant length,
                    // secret.lo = rkey checksum; data = reason when refused, else (same-host
                    // peers, shared region) a DirectInfo (with the owner's notify ring).
  kRevoke = 11,     // id: revocation round. data: u64 key ids no longer valid.
  kRevokeAck = 12,  // id: revocation round. Sent after every put/get with those keys completed.
  kBye = 13,        // the peer closed this channel.
  kRingWake = 14,   // a notify was published in the receiver's ring while it slept.
  kAuthProof = 15,  // connector -> acceptor, before anything else: the handshake's proof.
                    // Until it is checked the acceptor's channel takes no other message.
};

constexpr uint8_t kFlagNotify = 1;

struct AmHeader {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint16_t code = 0;     // replies: rdmaflow::Code of a refusal, 0 = accepted
  uint32_t channel = 0;  // the receiver's channel id
  uint64_t seq = 0;      // ordered types: per-channel sequence number
  uint64_t id = 0;       // see MsgType
  uint64_t key_id = 0;
  KeySecret secret;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t value = 0;
};
static_assert(sizeof(AmHeader) == 72, "AmHeader is part of the wire format");

// kKeyReply data for a same-host peer when the granted region is backed by a
// shared memfd: the peer maps descriptor `fd` of the owner process (pidfd_getfd)
// and then reads and writes the region with memcpy.
struct DirectInfo {
  static constexpr uint64_t kMagic = 0x7264666c6f777368ull;  // "rdflowsh"
  uint64_t magic = kMagic;
  uint64_t region = 0;  // the owner's region id (never reused)
  uint64_t base = 0;    // the region's address in the owner
  uint64_t length = 0;  // the region's length
  int32_t fd = -1;      // the memfd, a descriptor of the owner process
  // The owner's eventfd its sleeping threads wait on (with the ring; -1: none).
  int32_t wake_fd = -1;
  // The owner's notify ring for this channel (shm/notify_ring.h), -1 / 0 when it has none.
  int32_t ring_fd = -1;
  uint32_t ring_slots = 0;
};
static_assert(sizeof(DirectInfo) == 48, "DirectInfo is part of the wire format");

// A refused ordered operation, reported back in kAck.
struct Refusal {
  uint64_t seq = 0;
  uint16_t code = 0;
  std::string reason;
};

constexpr size_t kMaxReason = 512;

// FNV-1a of a packed rkey: lets the initiator check the blob in a RemoteKey is the
// one the owner packed before handing it to ucp_ep_rkey_unpack.
inline uint64_t rkey_checksum(std::span<const uint8_t> blob) {
  return fnv1a(blob);
}

// Each refusal: u64 seq | u16 code | u16 reason length | reason.
inline void append_refusal(std::vector<uint8_t>& out, const Refusal& r) {
  const auto n = static_cast<uint16_t>(std::min(r.reason.size(), kMaxReason));
  ByteWriter w(12 + n);
  w.u64(r.seq).put(r.code).u16(n).raw(r.reason.data(), n);
  out.insert(out.end(), w.body().begin(), w.body().end());
}

// False on a malformed list.
inline bool parse_refusals(std::span<const uint8_t> in, std::vector<Refusal>& out) {
  ByteReader rd(in);
  while (!rd.done()) {
    Refusal r;
    uint16_t n = 0;
    std::span<const uint8_t> reason;
    if (!rd.get(r.seq) || !rd.get(r.code) || !rd.get(n) || !rd.view(n, reason)) return false;
    r.reason.assign(reinterpret_cast<const char*>(reason.data()), reason.size());
    out.push_back(std::move(r));
  }
  return true;
}

// The decoders below take everything from the peer as untrusted. They are pure,
// so the receive path (ucx_recv.cc) and the fuzz target (fuzz/fuzz_ucx_am.cc)
// run the same code.

// Empty when an active message with header `h` and `length` data bytes (`rndv`:
// announced, still to be pulled) may be acted on, else what is wrong with it. A
// message longer than `max_message` (RDMAFLOW_MAX_MESSAGE_BYTES) is refused before
// anything is allocated for it. What a message carries is checked by its handler
// (grants, sequence, op ids).
inline std::string check_am(const AmHeader& h, size_t length, bool rndv, uint64_t max_message) {
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::kMessage:
      if (length > max_message) {
        return "message of " + std::to_string(length) +
               " bytes exceeds RDMAFLOW_MAX_MESSAGE_BYTES=" + std::to_string(max_message);
      }
      return {};
    case MsgType::kWrite:
      if (length != h.length) {
        return "write carries " + std::to_string(length) + " bytes, header says " +
               std::to_string(h.length);
      }
      return {};
    case MsgType::kNotify:
    case MsgType::kBye:
    case MsgType::kReadResp:
      return {};  // may come by rendezvous
    case MsgType::kHello:
    case MsgType::kHelloAck:
    case MsgType::kAck:
    case MsgType::kReadReq:
    case MsgType::kKeyQuery:
    case MsgType::kKeyReply:
    case MsgType::kRevoke:
    case MsgType::kRevokeAck:
    case MsgType::kRingWake:
    case MsgType::kAuthProof:
      if (rndv) return "unexpected rendezvous data for message type " + std::to_string(h.type);
      if (static_cast<MsgType>(h.type) == MsgType::kRevoke && length % 8 != 0) {
        return "malformed revocation list";
      }
      return {};
  }
  return "unknown message type " + std::to_string(h.type);
}

// kRevoke data: the revoked key ids (check_am() checked the length).
inline std::vector<uint64_t> parse_revocations(std::span<const uint8_t> in) {
  std::vector<uint64_t> ids(in.size() / 8);
  if (!ids.empty()) std::memcpy(ids.data(), in.data(), ids.size() * 8);
  return ids;
}

// kKeyReply data of a direct channel: the DirectInfo when it is one (right size
// and magic). `region_usable()` says whether its region may be mapped.
inline std::optional<DirectInfo> parse_direct_info(std::span<const uint8_t> in) {
  DirectInfo info;
  if (in.size() != sizeof(info)) return std::nullopt;
  std::memcpy(&info, in.data(), sizeof(info));
  if (info.magic != DirectInfo::kMagic) return std::nullopt;
  return info;
}
inline bool region_usable(const DirectInfo& info) {
  return info.region != 0 && info.length > 0 && info.base + info.length > info.base;
}

}  // namespace rdmaflow::ucx
