// Little-endian byte encoding for every wire format and exchanged blob: an
// append-only writer and a bounds-checked reader. Every supported host is
// little endian, so fixed-size values are copied as they are; a reader never
// reads past its span (each accessor reports failure instead), so decoding
// hostile bytes cannot overrun.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace rdmaflow {

static_assert(std::endian::native == std::endian::little, "wire formats are little endian");

// A fixed-size value at `p` (no alignment needed).
template <typename T>
T load_le(const uint8_t* p) {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// FNV-1a: a cheap check that an exchanged blob (an address, a packed key)
// arrived whole and unaltered. Not a defence against an attacker.
inline uint64_t fnv1a(std::span<const uint8_t> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

class ByteWriter {
 public:
  ByteWriter() = default;
  explicit ByteWriter(size_t reserve) { out_.reserve(reserve); }

  template <typename T>
  ByteWriter& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return raw(&v, sizeof v);
  }
  ByteWriter& u8(uint8_t v) { return put(v); }
  ByteWriter& u16(uint16_t v) { return put(v); }
  ByteWriter& u32(uint32_t v) { return put(v); }
  ByteWriter& u64(uint64_t v) { return put(v); }
  ByteWriter& i32(int32_t v) { return put(v); }
  ByteWriter& i64(int64_t v) { return put(v); }
  ByteWriter& raw(const void* p, size_t n) {
    if (n == 0) return *this;
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  // A u32 length, then the bytes.
  ByteWriter& bytes(std::span<const uint8_t> b) {
    u32(static_cast<uint32_t>(b.size()));
    return raw(b.data(), b.size());
  }
  ByteWriter& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }

  const std::vector<uint8_t>& body() const { return out_; }
  std::vector<uint8_t>& out() { return out_; }
  std::vector<uint8_t> take() { return std::move(out_); }
  // The body behind a u32 length prefix (a stream frame).
  std::vector<uint8_t> frame() const {
    std::vector<uint8_t> f(4 + out_.size());
    const auto n = static_cast<uint32_t>(out_.size());
    std::memcpy(f.data(), &n, 4);
    if (!out_.empty()) std::memcpy(f.data() + 4, out_.data(), out_.size());
    return f;
  }

 private:
  std::vector<uint8_t> out_;
};

// Each accessor comes in two forms: `bool get(T&)` for decoders that test as
// they go, `std::optional<T> next<T>()` for those that chain.
class ByteReader {
 public:
  static constexpr size_t kNoLimit = std::numeric_limits<size_t>::max();

  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}

  template <typename T>
  bool get(T& v) {
    return raw(&v, sizeof v);
  }
  template <typename T>
  std::optional<T> next() {
    T v;
    if (!get(v)) return std::nullopt;
    return v;
  }
  bool u8(uint8_t& v) { return get(v); }
  bool u32(uint32_t& v) { return get(v); }
  bool u64(uint64_t& v) { return get(v); }
  std::optional<uint8_t> u8() { return next<uint8_t>(); }
  std::optional<uint32_t> u32() { return next<uint32_t>(); }
  std::optional<uint64_t> u64() { return next<uint64_t>(); }
  std::optional<int32_t> i32() { return next<int32_t>(); }
  std::optional<int64_t> i64() { return next<int64_t>(); }

  bool raw(void* p, size_t n) {
    if (n > left()) return false;
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // The next `n` bytes in place.
  bool view(size_t n, std::span<const uint8_t>& out) {
    if (n > left()) return false;
    out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // A u32 length (at most `max_len`), then that many bytes.
  bool bytes(std::vector<uint8_t>& b, size_t max_len = kNoLimit) {
    std::span<const uint8_t> v;
    if (!prefixed(v, max_len)) return false;
    b.assign(v.begin(), v.end());
    return true;
  }
  bool str(std::string& s, size_t max_len = kNoLimit) {
    std::span<const uint8_t> v;
    if (!prefixed(v, max_len)) return false;
    s.assign(reinterpret_cast<const char*>(v.data()), v.size());
    return true;
  }
  std::optional<std::string> str(size_t max_len) {
    std::string s;
    if (!str(s, max_len)) return std::nullopt;
    return s;
  }
  // Everything not read yet; the reader is then done.
  std::span<const uint8_t> rest() {
    auto r = in_.subspan(pos_);
    pos_ = in_.size();
    return r;
  }
  size_t left() const { return in_.size() - pos_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool prefixed(std::span<const uint8_t>& out, size_t max_len) {
    const size_t start = pos_;
    uint32_t n = 0;
    if (!get(n) || n > max_len || !view(n, out)) {
      pos_ = start;
      return false;
    }
    return true;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace rdmaflow
