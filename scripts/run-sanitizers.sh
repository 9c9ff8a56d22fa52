#!/usr/bin/env bash
# Sanitizer passes over the test suite. Not part of CI (each would double CI's
# time on 2 cores or more); run them before landing changes to memory-handling
# or threading code.
#
#   scripts/run-sanitizers.sh [ctest args]            ASan + UBSan, in build-asan/
#   scripts/run-sanitizers.sh --thread [ctest args]   ThreadSanitizer, in build-tsan/
#
# Both run without the long collectives-full label (LABELS_EXCLUDE="" runs
# everything). BUILD_DIR overrides the build directory; extra arguments go to
# ctest (e.g. -R Conformance). ThreadSanitizer also leaves out the gRPC
# baseline's own tests (TSAN_EXCLUDE, a ctest -E regex; "" runs them): gRPC is
# not instrumented, so ThreadSanitizer sees none of its synchronisation and
# takes hand-offs of memory through gRPC's threads for races, each one built
# into a report (stacks symbolised) only to be matched by tsan.supp and
# dropped: GrpcTensor.* ran 100 to over 900 times slower than in a plain build
# (0.1 s -> 15 s, and past ctest's 180 s) while what they test is gRPC moving
# tensors. The Session's grpc rows stay in (their tensors are small). ThreadSanitizer reads tests/tsan.supp: races
# inside libraries that are not built with it (UCX, libibverbs, gRPC), whose
# synchronisation it cannot see; rdmaflow's own code is never suppressed there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=address
if [ "${1:-}" = "--thread" ]; then
  MODE=thread
  shift
fi
LABELS_EXCLUDE="${LABELS_EXCLUDE-collectives-full}"
EXCLUDE=""
if [ "$MODE" = thread ]; then
  EXCLUDE="${TSAN_EXCLUDE-^GrpcTensor\.}"
  BUILD_DIR="${BUILD_DIR:-$ROOT/build-tsan}"
  FLAGS=(-DRDMAFLOW_TSAN=ON)
  export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/tsan.supp}"
  # UCX's memory hooks (libucm, loaded with libucs by every test binary)
  # patch malloc, free and mmap, which ThreadSanitizer intercepts too: with
  # them, ranks crash (SIGSEGV) or report UCX's own allocator lock around our
  # frees. Off, UCX only loses its registration cache.
  export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
else
  BUILD_DIR="${BUILD_DIR:-$ROOT/build-asan}"
  FLAGS=(-DRDMAFLOW_SANITIZE=ON)
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "${FLAGS[@]}" -DRDMAFLOW_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
args=(--output-on-failure -j 2 --timeout 1800)
if [ -n "$LABELS_EXCLUDE" ]; then args+=(-LE "$LABELS_EXCLUDE"); fi
if [ -n "$EXCLUDE" ]; then args+=(-E "$EXCLUDE"); fi
cd "$BUILD_DIR" && ctest "${args[@]}" "$@"
