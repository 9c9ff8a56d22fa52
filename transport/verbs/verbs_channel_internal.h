// Declarations the three files of VerbsChannel share (verbs_channel.cc,
// verbs_send.cc, verbs_recv.cc); not part of the backend's interface.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace rdmaflow::verbs {

// A failed work completion in words, with what its status usually means.
std::string wc_error(const ibv_wc& wc);

inline uint64_t addr_of(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

}  // namespace rdmaflow::verbs
