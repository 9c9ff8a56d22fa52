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
//
// The codec below is the whole of the parsing: the server and the client call it,
// and so does the fuzz target (fuzz/fuzz_store_protocol.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace rdmaflow::store_wire {

enum class Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kBye = 5 };
enum class Reply : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxWaitKeys = 1u << 16;

// What a server accepts from a client (knobs, docs/configuration.md); a client
// refuses to send more. Every rank of a job must use the same values.
struct Limits {
  uint32_t max_frame = kMaxFrameBytes;  // RDMAFLOW_STORE_MAX_FRAME_BYTES: one request or reply
  uint32_t max_key = kMaxKeyBytes;      // RDMAFLOW_STORE_MAX_KEY_BYTES: one key name
};
// The limits from the environment; a malformed value is logged and the default kept.
Limits limits_from_env();

// Empty when a frame of `len` body bytes may be read, else why not (naming the knob).
std::string check_frame_length(uint32_t len, const Limits& limits);

struct Request {
  Op op = Op::kSet;
  uint32_t timeout_ms = 0;        // get, wait: how long the server waits
  std::vector<std::string> keys;  // set, get, add: one; wait: up to kMaxWaitKeys
  std::vector<uint8_t> value;     // set
  int64_t delta = 0;              // add
  int32_t rank = 0;               // bye
  bool operator==(const Request&) const = default;
};

// The request body (no length prefix). The timeout of get and wait is the u32 at
// body offset 1 (kTimeoutOffset), which a client patches just before sending.
std::vector<uint8_t> encode_request(const Request& r);
constexpr size_t kTimeoutOffset = 1;
// Parses a request body; kInvalidArgument saying what is malformed.
Result<Request> parse_request(std::span<const uint8_t> body, const Limits& limits);

}  // namespace rdmaflow::store_wire
