// The one source of RemoteKey secrets (and of the first key id) for every
// backend: 64-bit values from the kernel's CSPRNG (getrandom(2)). A secret is
// what stops a peer from forging a key for memory it was never granted, so it
// must not be predictable from the secrets a peer has seen, which the output of
// a seeded software generator is.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace rdmaflow {

// Thread safe. Drawn from a small per-process pool refilled by one getrandom(2)
// call, so exporting a key costs a syscall only every few dozen keys; a forked
// child discards the pool it inherited, so parent and child never share a value.
// Fails (kInternal, naming errno) only when the kernel refuses randomness.
Result<uint64_t> key_secret();

}  // namespace rdmaflow
