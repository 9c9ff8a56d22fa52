#include "transport/ucx/ucx_address.h"

#include <charconv>
#include <cstring>

#include "common/bytes.h"

namespace rdmaflow::ucx {

namespace {

constexpr const char* kPrefix = "ucx:1:";

template <typename T>
bool parse_number(std::string_view s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string encode_address(const ProcessIdentity& identity, std::span<const uint8_t> worker) {
  static const char* kHex = "0123456789abcdef";
  // The checksum catches truncated or altered addresses, which UCX itself may
  // accept (it ignores trailing bytes) and then reach the wrong worker.
  std::string out = kPrefix + identity.boot_id + ":" + std::to_string(identity.pid_ns) + ":" +
                    std::to_string(identity.pid) + ":" + std::to_string(identity.start_time) + ":" +
                    std::to_string(fnv1a(worker)) + ":";
  out.reserve(out.size() + 2 * worker.size());
  for (uint8_t b : worker) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Result<PeerAddress> decode_address(const std::string& text) {
  auto bad = [&](const std::string& why) {
    std::string shown = text.size() > 48 ? text.substr(0, 48) + "..." : text;
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse ucx address", -1,
                          "'" + shown + "' is not a UCX backend address (" + why +
                              "; expected ucx:1:<boot id>:<pid ns>:<pid>:<start>:<sum>:<hex>)");
  };
  if (text.rfind(kPrefix, 0) != 0) return bad("wrong prefix");
  std::vector<std::string_view> parts;
  std::string_view rest(text);
  rest.remove_prefix(std::strlen(kPrefix));
  for (int i = 0; i < 5; ++i) {
    auto colon = rest.find(':');
    if (colon == std::string_view::npos) return bad("missing fields");
    parts.push_back(rest.substr(0, colon));
    rest.remove_prefix(colon + 1);
  }
  PeerAddress a;
  a.identity.boot_id = std::string(parts[0]);
  if (a.identity.boot_id.empty()) return bad("empty boot id");
  if (!parse_number(parts[1], a.identity.pid_ns) || !parse_number(parts[2], a.identity.pid) ||
      !parse_number(parts[3], a.identity.start_time) || a.identity.pid <= 0) {
    return bad("bad process identity");
  }
  if (rest.empty() || rest.size() % 2 != 0) return bad("worker address is not an even hex string");
  a.worker.reserve(rest.size() / 2);
  for (size_t i = 0; i < rest.size(); i += 2) {
    int hi = hex_value(rest[i]), lo = hex_value(rest[i + 1]);
    if (hi < 0 || lo < 0) return bad("worker address is not hex");
    a.worker.push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  uint64_t sum = 0;
  if (!parse_number(parts[4], sum) || sum != fnv1a(a.worker)) {
    return bad("checksum mismatch: truncated or altered");
  }
  return a;
}

}  // namespace rdmaflow::ucx
