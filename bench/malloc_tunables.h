// glibc malloc tunables that keep freed multi-megabyte buffers in the process
// instead of returning them to the kernel and faulting them in again for the
// next message. gRPC allocates such buffers per message and is several times
// faster with them (docs/grpc-baseline.md, "Measured reference"), so the
// benchmarks run their gRPC references, and every row beside them, with them.
#pragma once

namespace rdmaflow::bench {

inline constexpr const char* kMallocTunables =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296";

}  // namespace rdmaflow::bench
