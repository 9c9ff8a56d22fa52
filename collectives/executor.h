// Executor: runs one rank's Program over the Fabric on one lane.
//
// It is a small dataflow engine on the calling thread: any item whose
// dependencies are done runs as soon as its remote condition holds (a send
// needs the credit of its slot, a receive needs its piece's notify). Sends are
// posted asynchronously, so reductions on this thread overlap the transfers
// the transports carry out. While nothing is ready it drives the backend's
// progress itself (WaitDriver) and starts what that enables from inside the
// drive, so a notify reaches its consumer with no thread hop and a post wakes
// no progress thread; it yields the core every few polls when the host is
// oversubscribed (FabricConfig::yield_polls), polls without blocking for
// FabricConfig::poll after progress otherwise (30 us by default; a poller that
// loses its core stops for 50 ms), and sleeps on the fabric's Signal
// only after FabricConfig::spin without progress; never past the deadline.
// Small sends (<= Fabric::kSmallBytes) are staged and not waited for.
// With same-host direct peers (fabric.h, "Direct path") a send is a put into
// the peer's slot and a signal over its shm::MemoryChannel, complete at once;
// the executor then polls sequence words for `spin` and sleeps on the memory
// endpoint's doorbell (shm::MemoryEndpoint::poll), waking every 20 ms to look
// at the deadline and the peers' channels. With direct peers and tcp peers
// both, a crowded rank also polls the tcp sockets at every look at the words
// and reads what came (Fabric::mixed_poll_driver), handing them back to tcp's
// progress thread before it sleeps; with RDMAFLOW_COLL_MIXED_WAIT=1 it waits
// for both in one ppoll instead (Fabric::mixed_driver): the tcp sockets, read
// on this thread, and the wake socket its same-host peers' doorbell rings send
// to (common/doorbell.h, "Fd sleepers").
#pragma once

#include <chrono>
#include <string>

#include "collectives/fabric.h"
#include "collectives/program.h"
#include "common/status.h"

namespace rdmaflow {

// Runs `program` (finalized) on `lane`. `what` names the collective in errors,
// e.g. "allreduce[ring]". On failure the lane's sequence numbers are left
// inconsistent with the peers': the caller must treat the communicator as
// broken (as MPI and NCCL do).
Status execute(Fabric& fabric, const Program& program, int lane,
               std::chrono::steady_clock::time_point deadline, const std::string& what);

}  // namespace rdmaflow
