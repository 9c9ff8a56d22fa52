// The TCP receive path's decisions on a stream of frames from a hostile peer
// (transport/tcp/tcp_frame.h, called by tcp_recv.cc): every header passes
// check_frame_header() or the stream ends (the channel fails); a write lands only
// inside the grant it names, the whole write checked on its first chunk.
//
// Input: frames as the receiver reads them, a 72-byte FrameHeader then its
// payload (as much as the input still holds).
#include <memory>

#include "fuzz/fuzz_target.h"
#include "transport/tcp/tcp_frame.h"

namespace {

using namespace rdmaflow;
using namespace rdmaflow::tcp;

constexpr size_t kRegion = 4096;
constexpr size_t kGrantAt = 1024, kGrantLen = 2048;

struct World {
  GrantTable grants{"tcp"};
  std::unique_ptr<uint8_t[]> region{new uint8_t[kRegion]()};  // exact size: ASan sees overruns
  RemoteKey key;
  FrameLimits limits{.max_frame = 512, .max_message = 256};  // scaled to -max_len
  World() {
    if (!grants.add_region(region.get(), kRegion).is_ok()) std::abort();
    auto k = grants.grant(region.get() + kGrantAt, kGrantLen);
    if (!k.is_ok()) std::abort();
    key = *k;
  }
};

World& world() {
  static World w;
  return w;
}

// Key id 0 (never issued) names the live grant with its secret, so the fuzzer
// reaches the range checks without guessing a secret. The two lines to adjust if
// the header's key fields change.
void name_the_grant(FrameHeader& h, const RemoteKey& key) {
  h.key_id = key.key_id;
  h.secret = key.secret;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = world();
  rdmaflow::fuzz::Input in(data, size);
  uint8_t* const grant_begin = w.region.get() + kGrantAt;
  uint8_t* const grant_end = grant_begin + kGrantLen;
  FrameHeader h;
  while (in.take(h)) {
    if (h.key_id == 0) name_the_grant(h, w.key);
    if (!check_frame_header(h, w.limits).empty()) return 0;  // the channel fails here
    const auto type = static_cast<FrameType>(h.type);
    FUZZ_CHECK(h.magic == kFrameMagic);
    FUZZ_CHECK(type != FrameType::kWrite || h.length <= w.limits.max_frame);
    FUZZ_CHECK(type != FrameType::kReadResponse || h.length <= w.limits.max_frame);
    FUZZ_CHECK(type != FrameType::kMessage || h.length <= w.limits.max_message);
    FUZZ_CHECK(type != FrameType::kWriteAck || h.length == 0);
    FUZZ_CHECK(type != FrameType::kReadRequest || (h.length == 0 && h.value <= kMaxReadRequest));
    auto payload = in.bytes(h.length);
    if (type != FrameType::kWrite) continue;
    uint8_t* dst = nullptr;
    if (!resolve_write_target(w.grants, h, 1, &dst).is_ok()) continue;  // NACKed
    FUZZ_CHECK(dst >= grant_begin && dst <= grant_end &&
               h.length <= static_cast<uint64_t>(grant_end - dst));
    if (h.flags & kFlagFirst) {  // the whole write fits too
      const uint64_t from = (h.flags & kFlagShare) ? h.value : h.offset;
      FUZZ_CHECK(from <= kGrantLen && h.total <= kGrantLen - from);
    }
    if (!payload.empty()) std::memcpy(dst, payload.data(), payload.size());
  }
  return 0;
}

rdmaflow::fuzz::Seeds fuzz_seeds() {
  using rdmaflow::fuzz::append;
  auto frame = [](FrameType type, uint8_t flags, uint64_t length, uint64_t offset, uint64_t value,
                  uint64_t total) {
    FrameHeader h;
    h.type = static_cast<uint8_t>(type);
    h.flags = flags;
    h.length = length;
    h.op_id = 7;
    h.offset = offset;
    h.value = value;
    h.total = total;
    std::vector<uint8_t> out;
    append(out, h);
    out.resize(out.size() + length, 0x5a);
    return out;
  };
  std::vector<uint8_t> chunks = frame(FrameType::kWrite, kFlagFirst, 100, 0, 0, 200);
  append(chunks, frame(FrameType::kWrite, kFlagLast | kFlagHasNotify, 100, 100, 9, 200));
  std::vector<uint8_t> mixed = frame(FrameType::kMessage, 0, 16, 0, 0, 0);
  append(mixed, frame(FrameType::kReadRequest, 0, 0, 64, 128, 0));
  append(mixed, frame(FrameType::kWriteAck, 0, 0, 0, 0, 0));
  append(mixed, frame(FrameType::kWriteNack, 0, 12, 0, 0, 0));
  append(mixed, frame(FrameType::kReadResponse, kFlagFirst | kFlagLast, 32, 0, 0, 0));
  return {
      {"write", frame(FrameType::kWrite, kFlagFirst | kFlagLast, 64, 8, 0, 64)},
      {"write_chunks", chunks},
      {"write_share", frame(FrameType::kWrite, kFlagFirst | kFlagShare, 32, 512, 256, 1024)},
      {"mixed", mixed},
  };
}
