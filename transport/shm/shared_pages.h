// Direct shared-memory access between same-host peers (docs/architecture.md,
// "The same-host path"; docs/ucx.md, "Data paths").
//
// A same-host transport reaches a peer's registered memory fastest with one
// user-space memcpy (UCX 1.13, for one, reaches ordinary memory of a same-host
// peer only by CMA, a kernel copy that pins pages every call, or by emulating
// RMA with active messages; both stay far from memcpy). So a registered region whose
// pages are private anonymous memory (malloc'ed or mmap'ed buffers, arena slabs)
// is re-backed in place by a memfd when it is registered: same address, same
// contents, but now a shared mapping. A same-host peer fetches the memfd with
// pidfd_getfd (the permission CMA needs too), maps it (PeerMemory,
// peer_memory.h), and a write or read is one user-space memcpy between the two
// processes' memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace rdmaflow::shm {

// The part of a registered region that share_in_place re-backed.
struct SharedRange {
  int fd = -1;  // the memfd
  uintptr_t base = 0;
  size_t length = 0;
};

// Re-backs the whole pages inside [addr, addr + len) by a new memfd without
// moving them or changing their contents. Refuses (kNotViable, with the reason)
// ranges it cannot share: less than a page, or not entirely private anonymous
// read/write memory (file mappings, huge pages, stacks, ...). Other threads must
// not write the range while this runs (the pages are copied, then swapped in).
Result<SharedRange> share_in_place(void* addr, size_t len);

// Undoes share_in_place: the pages become private anonymous memory again with the
// same contents (a peer still mapping the memfd no longer reaches them), and the
// memfd is closed. Pages the memfd no longer backs (the owner unmapped them before
// deregistering) are left alone. Other threads must not write the range meanwhile:
// memory must be deregistered before it is freed.
void unshare_in_place(const SharedRange& shared);

// Maps `len` bytes of the memfd that is descriptor `remote_fd` in the process of
// `pidfd`; the caller munmaps it.
Result<uint8_t*> map_peer_memfd(int pidfd, int remote_fd, size_t len);
// A copy of descriptor `remote_fd` of the process of `pidfd`, refused unless it is
// an eventfd (the caller owns and closes it).
Result<int> fetch_peer_eventfd(int pidfd, int remote_fd);

}  // namespace rdmaflow::shm
