// What a TCP receiver checks on a frame before it acts on it: the header's own
// consistency against the limits (a peer is never trusted with a size), and the
// memory a write may land in. Pure functions, so the receive path
// (tcp_recv.cc) and the fuzz target (fuzz/fuzz_tcp_frames.cc) run the same code.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/common/grant_table.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaflow::tcp {

// Bounds on what a peer may send (knobs, docs/configuration.md).
struct FrameLimits {
  uint64_t max_frame = kMaxChunkPayload;    // RDMAFLOW_MAX_FRAME_BYTES: one write / read chunk
  uint64_t max_message = kMaxMessageBytes;  // RDMAFLOW_MAX_MESSAGE_BYTES: one control message
};

// The limits from the environment; a malformed value is logged and the default kept.
FrameLimits frame_limits_from_env();

// Empty when `h` may be acted on, else what is wrong with it (magic, type, a
// payload beyond its type's limit, naming the knob that sets it).
std::string check_frame_header(const FrameHeader& h, const FrameLimits& limits);

// A write chunk's target: [offset, offset + length) of the grant, and on the first
// chunk the whole write ([offset, offset + total), or for a share of a striped
// write [value, value + total)), so a refused write writes nothing. `*dst` is set
// only when the result is OK.
Status resolve_write_target(const GrantTable& grants, const FrameHeader& h, int peer,
                            uint8_t** dst);

}  // namespace rdmaflow::tcp
