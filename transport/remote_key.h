// RemoteKey: the serializable grant a receiver hands to a peer so the peer may
// write into / read from exactly one byte range of one registered region.
//
// Wire form (little endian):
//   u32 magic 'RFK2' | u8 backend-name length | name | u64 key_id | u64 secret lo |
//   u64 secret hi | u64 addr | u64 length | u32 blob length | blob
// `addr` is the receiver's virtual address of the first granted byte (what
// one-sided verbs/UCX need); `key_id` + `secret` let a receiver that checks on
// its side (TCP) find the grant and refuse forged keys; `blob` is backend data
// (a packed UCP rkey, a verbs rkey).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rdmaflow {

// A grant's 128-bit secret, from the kernel's CSPRNG (transport/common/key_secret.h):
// guessing it is hopeless, and a wrong guess fails the channel that presented it.
struct KeySecret {
  uint64_t lo = 0;
  uint64_t hi = 0;
  auto operator<=>(const KeySecret&) const = default;
  // Without an early exit, so the time a check takes says nothing of how much matched.
  bool matches(const KeySecret& other) const { return ((lo ^ other.lo) | (hi ^ other.hi)) == 0; }
};

struct RemoteKey {
  std::string backend;
  uint64_t key_id = 0;
  KeySecret secret;
  uint64_t addr = 0;
  uint64_t length = 0;
  std::vector<uint8_t> blob;

  std::vector<uint8_t> serialize() const;
  static Result<RemoteKey> deserialize(std::span<const uint8_t> bytes);

  // True when [offset, offset + len) lies inside the grant (overflow-safe).
  bool covers(uint64_t offset, uint64_t len) const {
    return offset <= length && len <= length - offset;
  }
};

// RDMAFLOW_MAX_KEY_BYTES (read once): deserialize() refuses a longer key before
// looking inside it.
size_t max_key_bytes();

// The checks every channel makes before using `key` for [offset, offset + len):
// it was made by `backend` (kInvalidArgument otherwise) and covers the range
// (kOutOfRange), naming `op` and `peer`.
Status check_key_use(const RemoteKey& key, std::string_view backend, uint64_t offset, uint64_t len,
                     const char* op, int peer);

}  // namespace rdmaflow
