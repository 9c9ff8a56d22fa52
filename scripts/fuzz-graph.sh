#!/usr/bin/env bash
# Builds the graph-loader fuzzer (graph/fuzz/fuzz_graph_loader.cc) with clang,
# libFuzzer and ASan/UBSan in its own build directory, then runs it briefly on
# a seed corpus made of the example graphs and the test data. A crash, leak,
# timeout or failed round trip fails the script and leaves the input in
# $FUZZ_BUILD_DIR/artifacts/.
#   FUZZ_SECONDS   how long to fuzz (default 20)
#   FUZZ_BUILD_DIR build directory (default build-fuzz)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_TO_RUN="${FUZZ_SECONDS:-20}"

echo "== fuzz: build fuzz_graph_loader (clang, libFuzzer, ASan/UBSan) in $BUILD_DIR =="
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRDMAFLOW_FUZZ=ON -DRDMAFLOW_SANITIZE=ON -DRDMAFLOW_WERROR=OFF \
  -DRDMAFLOW_BUILD_TESTS=OFF -DRDMAFLOW_BUILD_BENCH=OFF \
  -DRDMAFLOW_WITH_UCX=OFF -DRDMAFLOW_WITH_VERBS=OFF -DRDMAFLOW_WITH_GRPC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
cmake --build "$BUILD_DIR" --target fuzz_graph_loader -j "${JOBS:-2}"

CORPUS="$BUILD_DIR/corpus"
ARTIFACTS="$BUILD_DIR/artifacts"
mkdir -p "$CORPUS" "$ARTIFACTS"
SEEDS="$(mktemp -d)"
trap 'rm -rf "$SEEDS"' EXIT
cp "$ROOT"/graph/examples/*.json "$ROOT"/graph/fuzz/seeds/*.json "$ROOT"/tests/graph/data/*.json "$SEEDS"/

echo "== fuzz: run for ${SECONDS_TO_RUN}s =="
"$BUILD_DIR/graph/fuzz_graph_loader" -max_total_time="$SECONDS_TO_RUN" -max_len=8192 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$ARTIFACTS/" "$CORPUS" "$SEEDS"
echo "fuzz: fuzz_graph_loader ran ${SECONDS_TO_RUN}s without finding a problem"
