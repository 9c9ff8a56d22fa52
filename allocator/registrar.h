// The registration hook between the arena and the transports.
//
// The arena knows nothing about transports: it calls every MemoryRegistrar
// attached to it once per slab (at attach time for existing slabs, at slab
// creation for later ones) and once more when the slab is released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace rdmaflow {

// Identifies one registered region within one registrar.
using RegionId = uint64_t;

class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  virtual std::string registrar_name() const = 0;
  virtual Result<RegionId> register_memory(void* addr, size_t len) = 0;
  virtual Status deregister_memory(RegionId region) = 0;
};

}  // namespace rdmaflow
