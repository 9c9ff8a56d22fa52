// Wire format of the TCP store (documented in docs/configuration.md, "Rendezvous").
//
// Every message is a frame: u32 body length | body. Integers are little endian.
//   request body := u8 op | fields
//     kSet  : str key | str value
//     kGet  : u32 timeout_ms | str key            (server waits up to timeout_ms)
//     kWait : u32 timeout_ms | u32 n | n x str key
//     kAdd  : str key | i64 delta
//     kBye  : i32 rank                            (the rank is done with the store)
//   reply body := u8 status | payload
//     kOk      : get -> the value (rest of the body); add -> i64; others empty
//     kTimeout : a message naming what did not appear
//     kError   : a message saying what was wrong with the request
//   str := u32 length | bytes
// A request the server cannot parse gets a kError reply and the connection stays
// usable (the frame boundary is intact); a frame longer than kMaxFrameBytes gets a
// kError reply and the connection is closed. Requests on one connection are served
// in order, one at a time.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaflow::store_wire {

enum class Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kBye = 5 };
enum class Reply : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxWaitKeys = 1u << 16;

class Writer {
 public:
  Writer& u8(uint8_t v) {
    out_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) { return raw(&v, sizeof v); }
  Writer& i32(int32_t v) { return raw(&v, sizeof v); }
  Writer& i64(int64_t v) { return raw(&v, sizeof v); }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }
  Writer& bytes(std::span<const uint8_t> b) {
    u32(static_cast<uint32_t>(b.size()));
    return raw(b.data(), b.size());
  }
  Writer& raw(const void* p, size_t n) {
    static_assert(std::endian::native == std::endian::little, "wire format is little endian");
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  // The body wrapped in a frame (u32 length prefix).
  std::vector<uint8_t> frame() const {
    std::vector<uint8_t> f(4 + out_.size());
    uint32_t n = static_cast<uint32_t>(out_.size());
    std::memcpy(f.data(), &n, 4);
    if (!out_.empty()) std::memcpy(f.data() + 4, out_.data(), out_.size());
    return f;
  }
  const std::vector<uint8_t>& body() const { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Bounds-checked reader over a frame body; every accessor returns nullopt past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  std::optional<uint8_t> u8() {
    if (left() < 1) return std::nullopt;
    return b_[pos_++];
  }
  std::optional<uint32_t> u32() { return fixed<uint32_t>(); }
  std::optional<int32_t> i32() { return fixed<int32_t>(); }
  std::optional<int64_t> i64() { return fixed<int64_t>(); }
  std::optional<std::string> str(uint32_t max_len) {
    auto n = u32();
    if (!n || *n > max_len || *n > left()) return std::nullopt;
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), *n);
    pos_ += *n;
    return s;
  }
  std::span<const uint8_t> rest() {
    auto r = b_.subspan(pos_);
    pos_ = b_.size();
    return r;
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  template <typename T>
  std::optional<T> fixed() {
    if (left() < sizeof(T)) return std::nullopt;
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace rdmaflow::store_wire
