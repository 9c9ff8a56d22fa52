// The one source of RemoteKey secrets (and of the first key id) for every
// backend: 128-bit values from the kernel's CSPRNG (getrandom(2)). A secret is
// what stops a peer from forging a key for memory it was never granted, so it
// must not be predictable from the secrets a peer has seen, which the output of
// a seeded software generator is.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow {

// Thread safe. Drawn from a small per-process pool refilled by one getrandom(2)
// call, so exporting a key costs a syscall only every few dozen keys; a forked
// child discards the pool it inherited, so parent and child never share a value.
// Fails (kInternal, naming errno) only when the kernel refuses randomness.
Result<KeySecret> key_secret();
// One 64-bit value of the same pool (the first key id of a table).
Result<uint64_t> key_random64();

}  // namespace rdmaflow
