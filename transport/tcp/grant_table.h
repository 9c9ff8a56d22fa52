// Registered regions and the grants (RemoteKeys) exported from them.
//
// TCP emulates one-sided access, so the receiver checks every access itself:
// a frame names a grant by key id and proves it with the grant's random
// secret; the table resolves (key, secret, offset, length) to local memory or
// refuses with kNotFound / kOutOfRange. Thread safe: user threads register and
// export, the progress thread resolves.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <shared_mutex>
#include <unordered_map>

#include "allocator/registrar.h"
#include "allocator/status.h"
#include "transport/remote_key.h"

namespace rdmaflow::tcp {

class GrantTable {
 public:
  GrantTable();

  Result<RegionId> add_region(void* addr, size_t len);
  // Also revokes every grant inside the region.
  Status remove_region(RegionId id);

  Result<RemoteKey> grant(const void* addr, size_t len);
  Status revoke(const RemoteKey& key);

  // Resolves [offset, offset + len) of grant `key_id` to local memory. Refuses
  // unknown keys and wrong secrets with kNotFound, ranges outside the grant with
  // kOutOfRange; `op` and `peer` name the access in the returned error.
  Status resolve(uint64_t key_id, uint64_t secret, uint64_t offset, uint64_t len, uint8_t** out,
                 const char* op, int peer) const;

 private:
  struct Region {
    RegionId id;
    uintptr_t addr;
    size_t len;
  };
  struct Grant {
    uint64_t secret;
    uintptr_t addr;
    uint64_t len;
    RegionId region;
  };

  mutable std::shared_mutex mu_;
  std::map<uintptr_t, Region> regions_;  // by start address
  std::unordered_map<RegionId, uintptr_t> region_start_;
  std::unordered_map<uint64_t, Grant> grants_;
  RegionId next_region_ = 1;
  uint64_t next_key_ = 1;
  std::mt19937_64 rng_;
};

}  // namespace rdmaflow::tcp
