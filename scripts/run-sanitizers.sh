#!/usr/bin/env bash
# ASan + UBSan pass: builds the test suite with -DRDMAFLOW_SANITIZE=ON into
# build-asan/ (or $BUILD_DIR) and runs ctest, without the long collectives-full
# label (set LABELS_EXCLUDE="" to run everything). Not part of CI (it would
# double CI's time on 2 cores); run it before landing changes to memory-handling
# code. Extra arguments go to ctest (e.g. -R Conformance).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-asan}"
LABELS_EXCLUDE="${LABELS_EXCLUDE-collectives-full}"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRDMAFLOW_SANITIZE=ON -DRDMAFLOW_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
args=(--output-on-failure -j 2 --timeout 900)
if [ -n "$LABELS_EXCLUDE" ]; then args+=(-LE "$LABELS_EXCLUDE"); fi
cd "$BUILD_DIR" && ctest "${args[@]}" "$@"
