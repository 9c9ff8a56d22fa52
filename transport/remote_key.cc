#include "transport/remote_key.h"

#include <cstring>

namespace rdmaflow {

namespace {
constexpr uint32_t kMagic = 0x314b4652;  // "RFK1"
constexpr size_t kMaxBlob = 1 << 20;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // all supported hosts are little endian
  out.insert(out.end(), b, b + sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  bool get(T& v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool bytes(size_t n, const uint8_t*& p) {
    if (b_.size() - pos_ < n) return false;
    p = b_.data() + pos_;
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};
}  // namespace

std::vector<uint8_t> RemoteKey::serialize() const {
  std::vector<uint8_t> out;
  out.reserve(48 + backend.size() + blob.size());
  put<uint32_t>(out, kMagic);
  put<uint8_t>(out, static_cast<uint8_t>(backend.size()));
  out.insert(out.end(), backend.begin(), backend.end());
  put<uint64_t>(out, key_id);
  put<uint64_t>(out, secret);
  put<uint64_t>(out, addr);
  put<uint64_t>(out, length);
  put<uint32_t>(out, static_cast<uint32_t>(blob.size()));
  out.insert(out.end(), blob.begin(), blob.end());
  return out;
}

Result<RemoteKey> RemoteKey::deserialize(std::span<const uint8_t> bytes) {
  auto bad = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "decode remote key", -1,
                          why + " (" + std::to_string(bytes.size()) + " bytes given)");
  };
  Reader r(bytes);
  uint32_t magic = 0;
  uint8_t name_len = 0;
  if (!r.get(magic) || magic != kMagic) return bad("bad magic: not a RemoteKey");
  const uint8_t* p = nullptr;
  if (!r.get(name_len) || !r.bytes(name_len, p)) return bad("truncated backend name");
  RemoteKey k;
  k.backend.assign(reinterpret_cast<const char*>(p), name_len);
  uint32_t blob_len = 0;
  if (!r.get(k.key_id) || !r.get(k.secret) || !r.get(k.addr) || !r.get(k.length) ||
      !r.get(blob_len)) {
    return bad("truncated header");
  }
  if (blob_len > kMaxBlob) return bad("blob length " + std::to_string(blob_len) + " too large");
  if (!r.bytes(blob_len, p)) return bad("truncated blob");
  k.blob.assign(p, p + blob_len);
  if (!r.done()) return bad("trailing bytes");
  return k;
}

}  // namespace rdmaflow
