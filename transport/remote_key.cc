#include "transport/remote_key.h"

#include "common/bytes.h"
#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {

namespace {
constexpr uint32_t kMagic = 0x324b4652;  // "RFK2" (RFK1 had a 64-bit secret)
constexpr size_t kMaxBlob = 1 << 20;

}  // namespace

size_t max_key_bytes() {
  static const size_t limit = [] {
    constexpr int64_t kDefault = 64 << 10;
    // The floor only catches nonsense: 32 bytes is below every backend's key
    // (tcp's, the smallest, is 52), so a rank can be set to refuse every key
    // its peers present (session_test does, to see the refusal end to end).
    constexpr int64_t kFloor = 32;
    auto v = env_int("RDMAFLOW_MAX_KEY_BYTES", kDefault);
    if (!v.is_ok() || *v < kFloor || *v > (int64_t{1} << 30)) {
      RDMAFLOW_LOG_WARN("RDMAFLOW_MAX_KEY_BYTES must be a byte count in 32..2^30; using {}",
                        kDefault);
      return static_cast<size_t>(kDefault);
    }
    return static_cast<size_t>(*v);
  }();
  return limit;
}

std::vector<uint8_t> RemoteKey::serialize() const {
  ByteWriter w(56 + backend.size() + blob.size());
  w.u32(kMagic).u8(static_cast<uint8_t>(backend.size())).raw(backend.data(), backend.size());
  w.u64(key_id).u64(secret.lo).u64(secret.hi).u64(addr).u64(length);
  w.u32(static_cast<uint32_t>(blob.size())).raw(blob.data(), blob.size());
  return w.take();
}

Result<RemoteKey> RemoteKey::deserialize(std::span<const uint8_t> bytes) {
  auto bad = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "decode remote key", -1,
                          why + " (" + std::to_string(bytes.size()) + " bytes given)");
  };
  if (bytes.size() > max_key_bytes()) {
    return bad("key exceeds RDMAFLOW_MAX_KEY_BYTES=" + std::to_string(max_key_bytes()));
  }
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint8_t name_len = 0;
  if (!r.get(magic) || magic != kMagic) return bad("bad magic: not a RemoteKey");
  std::span<const uint8_t> p;
  if (!r.get(name_len) || !r.view(name_len, p)) return bad("truncated backend name");
  RemoteKey k;
  k.backend.assign(reinterpret_cast<const char*>(p.data()), p.size());
  uint32_t blob_len = 0;
  if (!r.get(k.key_id) || !r.get(k.secret.lo) || !r.get(k.secret.hi) || !r.get(k.addr) ||
      !r.get(k.length) || !r.get(blob_len)) {
    return bad("truncated header");
  }
  if (blob_len > kMaxBlob) return bad("blob length " + std::to_string(blob_len) + " too large");
  if (!r.view(blob_len, p)) return bad("truncated blob");
  k.blob.assign(p.begin(), p.end());
  if (!r.done()) return bad("trailing bytes");
  return k;
}

Status check_key_use(const RemoteKey& key, std::string_view backend, uint64_t offset, uint64_t len,
                     const char* op, int peer) {
  if (key.backend != backend) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, peer,
        "remote key belongs to backend '" + key.backend + "', not " + std::string(backend));
  }
  if (!key.covers(offset, len)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(key.length) +
                              " bytes granted by key id " + std::to_string(key.key_id));
  }
  return Status::ok();
}

}  // namespace rdmaflow
