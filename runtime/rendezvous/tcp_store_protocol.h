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

#include <cstdint>

#include "common/bytes.h"

namespace rdmaflow::store_wire {

enum class Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kBye = 5 };
enum class Reply : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxWaitKeys = 1u << 16;

}  // namespace rdmaflow::store_wire
