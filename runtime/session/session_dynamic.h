// The header a dynamic-shape transfer writes at the start of its slot
// (docs/session.md, "Dynamic tensors"). Little endian, at most meta_bytes:
//
//   u32 magic 'RFDH' | u8 dtype | u8 ndims | u8 inline (1: payload follows at
//   meta_bytes in the same write) | u8 extra keys (k) | u64 step |
//   u64 payload bytes | i64 dims[ndims] | u32 key length | RemoteKey (when not
//   inline) | k x (u32 key length | RemoteKey)
//
// The extra keys grant the same payload through other transports, when the
// receivers of one output reach it over different ones; each receiver reads with
// the key of its channel's backend.
//
// The receiver trusts nothing in it: dtype, dims and bytes must agree, the
// step must be the one notified, and a key must parse.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow::session_detail {

inline constexpr uint32_t kDynamicMagic = 0x48444652;  // "RFDH"
inline constexpr size_t kMaxDynamicDims = 32;
inline constexpr size_t kMaxDynamicExtraKeys = 8;

struct DynamicHeader {
  DataType dtype = DataType::kF32;
  bool inline_payload = true;
  uint64_t step = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> dims;
  std::optional<RemoteKey> key;      // where to read the payload when not inline
  std::vector<RemoteKey> more_keys;  // the same, through other transports
};

// Writes `h` into `out`; kInvalidArgument when it does not fit.
Status encode_dynamic_header(const DynamicHeader& h, std::span<uint8_t> out);
// Parses and checks a header; kProtocolError saying what is wrong.
Result<DynamicHeader> decode_dynamic_header(std::span<const uint8_t> in);

}  // namespace rdmaflow::session_detail
