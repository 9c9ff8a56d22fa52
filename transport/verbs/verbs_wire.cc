#include "transport/verbs/verbs_wire.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/bytes.h"

namespace rdmaflow::verbs {

namespace {
Status bad_hello(const std::string& why) {
  return RDMAFLOW_ERROR(Code::kProtocolError, "read connection hello", -1, why);
}
}  // namespace

std::vector<uint8_t> Hello::encode() const {
  ByteWriter w(kHelloSize);
  w.u32(kHelloMagic).u16(kHelloVersion).u16(0).i32(rank).u32(credits).u32(msg_size);
  w.u32(ring_slots).u32(ring_rkey).u64(ring_addr);
  return w.take();
}

Result<Hello> Hello::decode(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHelloSize) {
    return bad_hello("private data has " + std::to_string(bytes.size()) + " bytes, a hello needs " +
                     std::to_string(kHelloSize) + " (is the peer an rdmaflow verbs transport?)");
  }
  const uint8_t* p = bytes.data();
  if (load_le<uint32_t>(p) != kHelloMagic) {
    return bad_hello("bad magic: the peer is not an rdmaflow verbs transport");
  }
  uint16_t version = load_le<uint16_t>(p + 4);
  if (version != kHelloVersion) {
    return bad_hello("peer speaks hello version " + std::to_string(version) + ", this build " +
                     std::to_string(kHelloVersion));
  }
  Hello h;
  h.rank = load_le<int32_t>(p + 8);
  h.credits = load_le<uint32_t>(p + 12);
  h.msg_size = load_le<uint32_t>(p + 16);
  h.ring_slots = load_le<uint32_t>(p + 20);
  h.ring_rkey = load_le<uint32_t>(p + 24);
  h.ring_addr = load_le<uint64_t>(p + 28);
  if (h.rank < 0) return bad_hello("negative rank " + std::to_string(h.rank));
  if (h.credits < 4) {
    return bad_hello("peer grants " + std::to_string(h.credits) + " receive credits (minimum 4)");
  }
  if (h.msg_size < kMinMsgSize || h.msg_size > kMaxMsgSize) {
    return bad_hello("receive buffer size " + std::to_string(h.msg_size) + " outside [" +
                     std::to_string(kMinMsgSize) + ", " + std::to_string(kMaxMsgSize) + "]");
  }
  if (h.ring_slots < h.credits) {
    return bad_hello("notify ring of " + std::to_string(h.ring_slots) +
                     " slots is smaller than the credit window " + std::to_string(h.credits));
  }
  if (h.ring_addr == 0) return bad_hello("notify ring address is null");
  return h;
}

std::vector<uint8_t> AuthProof::encode(std::span<const uint8_t> proof, const Hello& hello) {
  std::vector<uint8_t> out(proof.begin(), proof.end());
  out.resize(kProofSize);
  const auto h = hello.encode();
  out.insert(out.end(), h.begin(), h.end());
  return out;
}

Result<AuthProof> AuthProof::decode(std::span<const uint8_t> payload, int peer) {
  if (payload.size() != kAuthProofSize) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "auth message of " + std::to_string(payload.size()) +
                              " bytes, expected " + std::to_string(kAuthProofSize));
  }
  AuthProof out;
  out.proof = payload.first(kProofSize);
  RDMAFLOW_ASSIGN_OR_RETURN(out.hello, Hello::decode(payload.subspan(kProofSize)));
  return out;
}

void MsgHeader::encode(uint8_t* out) const {
  out[0] = static_cast<uint8_t>(type);
  out[1] = last ? kFlagLastFragment : 0;
  out[2] = 0;
  out[3] = 0;
  std::memcpy(out + 4, &credits, 4);
}

Result<MsgHeader> MsgHeader::decode(std::span<const uint8_t> bytes, int peer) {
  if (bytes.size() < kMsgHeaderSize) {
    return RDMAFLOW_ERROR(
        Code::kProtocolError, "receive message", peer,
        "SEND of " + std::to_string(bytes.size()) + " bytes is shorter than the 8-byte header");
  }
  MsgHeader h;
  uint8_t type = bytes[0];
  if (type < static_cast<uint8_t>(MsgType::kData) || type > static_cast<uint8_t>(MsgType::kAuth)) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "unknown message type " + std::to_string(type));
  }
  if ((bytes[1] & ~kFlagLastFragment) != 0 || bytes[2] != 0 || bytes[3] != 0) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "reserved header bits set");
  }
  h.type = static_cast<MsgType>(type);
  h.last = (bytes[1] & kFlagLastFragment) != 0;
  std::memcpy(&h.credits, bytes.data() + 4, 4);
  if (h.type == MsgType::kCredit && (!h.last || bytes.size() != kMsgHeaderSize)) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "credit message with payload or fragment flag");
  }
  if (h.type != MsgType::kData && !h.last) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "fragmented control message");
  }
  return h;
}

namespace {
constexpr size_t kKeyCheckBytes = 52;
Status bad_control(const char* what, size_t size, int peer) {
  return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                        std::string("malformed ") + what + " (" + std::to_string(size) + " bytes)");
}
}  // namespace

std::vector<uint8_t> KeyCheck::encode() const {
  ByteWriter w(kKeyCheckBytes);
  w.u64(request).u64(claim.key_id).u64(claim.secret.lo).u64(claim.secret.hi);
  w.u64(claim.addr).u64(claim.length);
  w.u32(claim.rkey);
  return w.take();
}

Result<KeyCheck> KeyCheck::decode(std::span<const uint8_t> payload, int peer) {
  if (payload.size() != kKeyCheckBytes) return bad_control("key check", payload.size(), peer);
  const uint8_t* p = payload.data();
  KeyCheck k;
  k.request = load_le<uint64_t>(p);
  k.claim.key_id = load_le<uint64_t>(p + 8);
  k.claim.secret.lo = load_le<uint64_t>(p + 16);
  k.claim.secret.hi = load_le<uint64_t>(p + 24);
  k.claim.addr = load_le<uint64_t>(p + 32);
  k.claim.length = load_le<uint64_t>(p + 40);
  k.claim.rkey = load_le<uint32_t>(p + 48);
  return k;
}

std::vector<uint8_t> KeyVerdict::encode() const {
  ByteWriter w;
  w.u64(request).u8(static_cast<uint8_t>(code)).u32(rkey);
  w.raw(reason.data(), std::min(reason.size(), kMaxVerdictReason));
  return w.take();
}

Result<KeyVerdict> KeyVerdict::decode(std::span<const uint8_t> payload, int peer) {
  constexpr size_t kHead = 13;
  if (payload.size() < kHead || payload.size() > kHead + kMaxVerdictReason) {
    return bad_control("key verdict", payload.size(), peer);
  }
  KeyVerdict v;
  v.request = load_le<uint64_t>(payload.data());
  uint8_t code = payload[8];
  if (code > static_cast<uint8_t>(Code::kInternal)) {
    return bad_control("key verdict", payload.size(), peer);
  }
  v.code = static_cast<Code>(code);
  v.rkey = load_le<uint32_t>(payload.data() + 9);
  v.reason.assign(reinterpret_cast<const char*>(payload.data()) + kHead, payload.size() - kHead);
  return v;
}

std::vector<uint8_t> KeyRevoked::encode() const {
  return ByteWriter(8).u64(key_id).take();
}

Result<KeyRevoked> KeyRevoked::decode(std::span<const uint8_t> payload, int peer) {
  if (payload.size() != 8) return bad_control("key revocation", payload.size(), peer);
  return KeyRevoked{load_le<uint64_t>(payload.data())};
}

std::vector<std::pair<size_t, size_t>> plan_fragments(size_t total, size_t max_payload) {
  std::vector<std::pair<size_t, size_t>> out;
  if (max_payload == 0) return out;
  if (total == 0) {
    out.emplace_back(0, 0);
    return out;
  }
  out.reserve((total + max_payload - 1) / max_payload);
  for (size_t off = 0; off < total; off += max_payload) {
    out.emplace_back(off, std::min(max_payload, total - off));
  }
  return out;
}

Result<std::optional<std::vector<uint8_t>>> MessageReassembler::add(
    std::span<const uint8_t> payload, bool last, int peer) {
  if (payload.size() > max_ - partial_.size()) {
    size_t have = partial_.size();
    partial_.clear();
    return RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer,
                          "message exceeds RDMAFLOW_MAX_MESSAGE_BYTES=" + std::to_string(max_) +
                              " (" + std::to_string(have) + " buffered + " +
                              std::to_string(payload.size()) + " more)");
  }
  partial_.insert(partial_.end(), payload.begin(), payload.end());
  if (!last) return std::optional<std::vector<uint8_t>>();
  std::vector<uint8_t> out;
  out.swap(partial_);
  return std::optional<std::vector<uint8_t>>(std::move(out));
}

}  // namespace rdmaflow::verbs
