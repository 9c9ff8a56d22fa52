#include "runtime/rendezvous/tcp_store_protocol.h"

#include <algorithm>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow::store_wire {

namespace {

uint32_t limit_from_env(const char* name, uint32_t fallback, uint32_t least) {
  auto v = env_int(name, fallback);
  if (!v.is_ok() || *v < least || *v > UINT32_MAX) {
    RDMAFLOW_LOG_WARN("{} must be a byte count in {}..{}; using {}", name, least, UINT32_MAX,
                      fallback);
    return fallback;
  }
  return static_cast<uint32_t>(*v);
}

}  // namespace

Limits limits_from_env() {
  Limits l;
  l.max_frame = limit_from_env("RDMAFLOW_STORE_MAX_FRAME_BYTES", l.max_frame, 64);
  l.max_key = limit_from_env("RDMAFLOW_STORE_MAX_KEY_BYTES", l.max_key, 1);
  return l;
}

std::string check_frame_length(uint32_t len, const Limits& limits) {
  if (len <= limits.max_frame) return {};
  return "frame of " + std::to_string(len) +
         " bytes exceeds RDMAFLOW_STORE_MAX_FRAME_BYTES=" + std::to_string(limits.max_frame);
}

std::vector<uint8_t> encode_request(const Request& r) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case Op::kSet:
      w.str(r.keys.at(0)).bytes(r.value);
      break;
    case Op::kGet:
      w.u32(r.timeout_ms).str(r.keys.at(0));
      break;
    case Op::kWait:
      w.u32(r.timeout_ms).u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      break;
    case Op::kAdd:
      w.str(r.keys.at(0)).i64(r.delta);
      break;
    case Op::kBye:
      w.i32(r.rank);
      break;
  }
  return w.take();
}

Result<Request> parse_request(std::span<const uint8_t> body, const Limits& limits) {
  std::string too_long;  // a key over the limit: said instead of "malformed"
  auto bad = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse store request", -1,
                          too_long.empty() ? why : too_long);
  };
  ByteReader r(body);
  auto op = r.u8();
  if (!op) return bad("empty request");
  Request q;
  q.op = static_cast<Op>(*op);
  auto key = [&]() -> bool {
    std::string k;
    if (r.str(k, limits.max_key)) {
      q.keys.push_back(std::move(k));
      return true;
    }
    uint32_t n = 0;
    if (ByteReader(body.subspan(body.size() - r.left())).u32(n) && n > limits.max_key) {
      too_long = "key of " + std::to_string(n) +
                 " bytes exceeds RDMAFLOW_STORE_MAX_KEY_BYTES=" + std::to_string(limits.max_key);
    }
    return false;
  };
  switch (q.op) {
    case Op::kSet:
      if (!key() || !r.bytes(q.value) || !r.done()) return bad("malformed set request");
      return q;
    case Op::kGet:
      if (!r.u32(q.timeout_ms) || !key() || !r.done()) return bad("malformed get request");
      return q;
    case Op::kWait: {
      uint32_t n = 0;
      if (!r.u32(q.timeout_ms) || !r.u32(n) || n > kMaxWaitKeys) {
        return bad("malformed wait request");
      }
      // Each key takes at least its 4-byte length: never reserve for more than fit.
      q.keys.reserve(std::min<size_t>(n, r.left() / 4));
      for (uint32_t i = 0; i < n; ++i) {
        if (!key()) return bad("malformed wait request (key " + std::to_string(i) + ")");
      }
      if (!r.done()) return bad("malformed wait request (trailing bytes)");
      return q;
    }
    case Op::kAdd: {
      auto delta = key() ? r.i64() : std::nullopt;
      if (!delta || !r.done()) return bad("malformed add request");
      q.delta = *delta;
      return q;
    }
    case Op::kBye: {
      auto rank = r.i32();
      if (!rank || !r.done()) return bad("malformed goodbye request");
      q.rank = *rank;
      return q;
    }
  }
  return bad("unknown operation " + std::to_string(*op));
}

}  // namespace rdmaflow::store_wire
