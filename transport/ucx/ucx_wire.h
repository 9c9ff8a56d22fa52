// Wire format of the UCX backend: every message is one UCP active message
// (AM id kAmId) with a fixed 72-byte header; the header's type says what it is
// and the AM data carries the payload (message bytes, write payload, worker
// address, refusal list). See docs/ucx.md, "Wire protocol".
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
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

}  // namespace rdmaflow::ucx
