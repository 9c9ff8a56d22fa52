#!/usr/bin/env bash
# Builds the graph-loader fuzzers (graph/fuzz/fuzz_graph_loader.cc: JSON graph,
# placement and plan; graph/fuzz/fuzz_onnx_loader.cc: ONNX models, when
# libonnx-dev is installed) with clang, libFuzzer and ASan/UBSan in their own
# build directory, then runs each briefly on a seed corpus: the example graphs
# and test data for the first, the small models in graph/fuzz/onnx-seeds for
# the second. A crash, leak, timeout or failed round trip fails the script
# and leaves the input in $FUZZ_BUILD_DIR/artifacts/.
#   FUZZ_SECONDS   how long to fuzz in all, split between the targets (default 20)
#   FUZZ_BUILD_DIR build directory (default build-fuzz)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_TO_RUN="${FUZZ_SECONDS:-20}"

echo "== fuzz: build the graph fuzzers (clang, libFuzzer, ASan/UBSan) in $BUILD_DIR =="
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRDMAFLOW_FUZZ=ON -DRDMAFLOW_SANITIZE=ON -DRDMAFLOW_WERROR=OFF \
  -DRDMAFLOW_BUILD_TESTS=OFF -DRDMAFLOW_BUILD_BENCH=OFF \
  -DRDMAFLOW_WITH_UCX=OFF -DRDMAFLOW_WITH_VERBS=OFF -DRDMAFLOW_WITH_GRPC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
targets=(fuzz_graph_loader)
if grep -q "rdmaflow ONNX loader: ONNX" "$BUILD_DIR/configure.log"; then
  targets+=(fuzz_onnx_loader)
else
  echo "fuzz: no ONNX loader in this build (libonnx-dev missing): fuzz_onnx_loader skipped"
fi
cmake --build "$BUILD_DIR" --target "${targets[@]}" -j "${JOBS:-2}"

ARTIFACTS="$BUILD_DIR/artifacts"
mkdir -p "$ARTIFACTS"
SEEDS="$(mktemp -d)"
trap 'rm -rf "$SEEDS"' EXIT
mkdir -p "$SEEDS/fuzz_graph_loader" "$SEEDS/fuzz_onnx_loader"
cp "$ROOT"/graph/examples/*.json "$ROOT"/graph/fuzz/seeds/*.json "$ROOT"/tests/graph/data/*.json \
  "$SEEDS/fuzz_graph_loader/"
cp "$ROOT"/graph/fuzz/onnx-seeds/*.onnx "$SEEDS/fuzz_onnx_loader/"

# The time is split evenly, so the smoke run takes as long as it did with one target.
per_target=$(( SECONDS_TO_RUN / ${#targets[@]} ))
(( per_target >= 1 )) || per_target=1
for t in "${targets[@]}"; do
  corpus="$BUILD_DIR/corpus"
  [ "$t" = fuzz_graph_loader ] || corpus="$BUILD_DIR/corpus-$t"
  mkdir -p "$corpus"
  echo "== fuzz: run $t for ${per_target}s =="
  "$BUILD_DIR/graph/$t" -max_total_time="$per_target" -max_len=8192 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$ARTIFACTS/$t-" "$corpus" "$SEEDS/$t"
  echo "fuzz: $t ran ${per_target}s without finding a problem"
done
