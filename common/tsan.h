// ThreadSanitizer annotations (-DRDMAFLOW_TSAN=ON; no-ops in other builds).
//
// PeerAccess: a thread placing a peer's write into granted memory, or
// sending the bytes of a peer's read from it (tcp: GrantTable::enter ..
// leave; ucx: the eager write of the active-message path), acts for the
// peer. Those accesses are ordered with the owner's own by the job's
// protocol, which runs through the peer process (the owner lets the peer go,
// then waits for the notify), and ThreadSanitizer follows the threads of one
// process only: it reported each of them as a race with the owner's earlier
// or later use (conformance BadKeysAreRefusedAndMemoryIsUntouched: the owner
// checksums its region, a barrier through the test's parent process lets the
// peer write, the progress thread places the bytes). UCX's RMA and
// rendezvous paths place such bytes inside libucp, verbs through the NIC's
// DMA, shm from the peer's own process: ThreadSanitizer sees none of those.
// PeerAccess makes our own copies the same: they are not tracked. Everything
// around them (receive state, the fence's atomics, the inbox, completions)
// still is.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace rdmaflow {

// True in a ThreadSanitizer build, where every instrumented memory access is a
// call into the runtime: tests that repeat pure computation (the schedule
// simulations) run fewer repetitions there.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

struct PeerAccess {
  // Until end() on the same thread, its memory accesses are not tracked.
  static void begin() {
#if defined(__SANITIZE_THREAD__)
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  }
  static void end() {
#if defined(__SANITIZE_THREAD__)
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  }
};

}  // namespace rdmaflow
