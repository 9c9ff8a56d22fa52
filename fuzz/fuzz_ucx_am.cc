// The UCX backend's active messages from a hostile peer (transport/ucx/
// ucx_wire.h, called by ucx_recv.cc): check_am() accepts a header or the channel
// fails; then the data each type carries is decoded as the receiver does:
// refusal lists, revocation lists, the DirectInfo of a key reply.
//
// Input: a 72-byte AmHeader | u8 (bit 0: the data comes by rendezvous) | data.
#include "fuzz/fuzz_target.h"
#include "transport/ucx/ucx_wire.h"

using namespace rdmaflow::ucx;

namespace {
constexpr uint64_t kMaxMessage = 256;  // scaled to -max_len
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdmaflow::fuzz::Input in(data, size);
  AmHeader h;
  uint8_t flags = 0;
  if (!in.take(h) || !in.take(flags)) return 0;
  const auto body = in.rest();
  const bool rndv = (flags & 1) != 0;
  if (!check_am(h, body.size(), rndv, kMaxMessage).empty()) return 0;  // the channel fails
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::kMessage:
      FUZZ_CHECK(body.size() <= kMaxMessage);
      break;
    case MsgType::kWrite:
      FUZZ_CHECK(body.size() == h.length);
      break;
    case MsgType::kAck: {
      FUZZ_CHECK(!rndv);
      std::vector<Refusal> refusals;
      if (!parse_refusals(body, refusals)) break;
      std::vector<uint8_t> again;
      bool short_reasons = true;
      for (const auto& r : refusals) {
        short_reasons &= r.reason.size() <= kMaxReason;
        append_refusal(again, r);
      }
      if (short_reasons)
        FUZZ_CHECK(again.size() == body.size() &&
                   std::equal(again.begin(), again.end(), body.begin()));
      break;
    }
    case MsgType::kRevoke: {
      FUZZ_CHECK(!rndv);
      const auto ids = parse_revocations(body);
      FUZZ_CHECK(ids.size() * 8 == body.size());
      break;
    }
    case MsgType::kKeyReply: {
      FUZZ_CHECK(!rndv);
      auto info = parse_direct_info(body);
      if (info && region_usable(*info)) {
        FUZZ_CHECK(info->length > 0 && info->base + info->length > info->base);
      }
      break;
    }
    default:
      break;
  }
  return 0;
}

rdmaflow::fuzz::Seeds fuzz_seeds() {
  using rdmaflow::fuzz::append;
  auto seed = [](MsgType type, uint8_t flags, std::span<const uint8_t> body) {
    AmHeader h;
    h.type = static_cast<uint8_t>(type);
    h.channel = 1;
    h.seq = 4;
    h.length = body.size();
    std::vector<uint8_t> out;
    append(out, h);
    out.push_back(flags);
    append(out, body);
    return out;
  };
  std::vector<uint8_t> refusals;
  append_refusal(refusals, Refusal{3, 5, "wrong secret"});
  append_refusal(refusals, Refusal{4, 6, "out of range"});
  const uint64_t ids[] = {7, 8, 9};
  DirectInfo info;
  info.region = 2;
  info.base = 1 << 20;
  info.length = 4096;
  info.fd = 9;
  info.ring_fd = 10;
  info.ring_slots = 1024;
  std::vector<uint8_t> message(100, 0x33);
  return {
      {"ack", seed(MsgType::kAck, 0, refusals)},
      {"revoke", seed(MsgType::kRevoke, 0, {reinterpret_cast<const uint8_t*>(ids), sizeof(ids)})},
      {"key_reply",
       seed(MsgType::kKeyReply, 0, {reinterpret_cast<const uint8_t*>(&info), sizeof(info)})},
      {"message", seed(MsgType::kMessage, 0, message)},
      {"write", seed(MsgType::kWrite, 1, message)},
  };
}
