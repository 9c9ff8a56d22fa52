#include "transport/tcp/tcp_frame.h"

#include <algorithm>
#include <cstdio>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow::tcp {

namespace {

uint64_t limit_from_env(const char* name, uint64_t fallback, uint64_t most) {
  auto v = env_int(name, static_cast<int64_t>(fallback));
  if (!v.is_ok() || *v < 1) {
    RDMAFLOW_LOG_WARN("{} must be a positive byte count; using {}", name, fallback);
    return fallback;
  }
  return std::min(static_cast<uint64_t>(*v), most);
}

std::string too_big(const char* what, uint64_t n, const char* knob, uint64_t limit) {
  return std::string(what) + " of " + std::to_string(n) + " bytes exceeds " + knob + "=" +
         std::to_string(limit);
}

}  // namespace

FrameLimits frame_limits_from_env() {
  FrameLimits l;
  l.max_frame = limit_from_env("RDMAFLOW_MAX_FRAME_BYTES", l.max_frame, kMaxChunkPayload);
  l.max_message = limit_from_env("RDMAFLOW_MAX_MESSAGE_BYTES", l.max_message, kMaxMessageBytes);
  return l;
}

std::string check_frame_header(const FrameHeader& h, const FrameLimits& limits) {
  if (h.magic != kFrameMagic) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", h.magic);
    return std::string("bad magic ") + buf;
  }
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kWrite:
      if (h.length > limits.max_frame) {
        return too_big("write chunk", h.length, "RDMAFLOW_MAX_FRAME_BYTES", limits.max_frame);
      }
      return {};
    case FrameType::kWriteAck:
      if (h.length != 0) return "write ACK with " + std::to_string(h.length) + " payload bytes";
      return {};
    case FrameType::kWriteNack:
    case FrameType::kReadNack:
      if (h.length > kMaxReasonBytes) {
        return "refusal with a reason of " + std::to_string(h.length) + " bytes (at most " +
               std::to_string(kMaxReasonBytes) + ")";
      }
      return {};
    case FrameType::kReadRequest:
      if (h.length != 0 || h.value > kMaxReadRequest) {
        return "read request for " + std::to_string(h.value) + " bytes";
      }
      return {};
    case FrameType::kReadResponse:
      if (h.length > limits.max_frame) {
        return too_big("read response chunk", h.length, "RDMAFLOW_MAX_FRAME_BYTES",
                       limits.max_frame);
      }
      return {};
    case FrameType::kMessage:
      if (h.length > limits.max_message) {
        return too_big("message", h.length, "RDMAFLOW_MAX_MESSAGE_BYTES", limits.max_message);
      }
      return {};
  }
  return "unknown frame type " + std::to_string(h.type);
}

Status resolve_write_target(const GrantTable& grants, const FrameHeader& h, int peer,
                            uint8_t** dst) {
  const char* op = "write (remote side)";
  uint8_t* p = nullptr;
  if (h.flags & kFlagFirst) {
    const uint64_t from = (h.flags & kFlagShare) ? h.value : h.offset;
    RDMAFLOW_RETURN_IF_ERROR(grants.resolve(h.key_id, h.secret, from, h.total, &p, op, peer));
  }
  RDMAFLOW_RETURN_IF_ERROR(grants.resolve(h.key_id, h.secret, h.offset, h.length, &p, op, peer));
  *dst = p;
  return Status::ok();
}

}  // namespace rdmaflow::tcp
