#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/CMakeLists.txt: one per decoder of peer
# input) in one clang + libFuzzer + ASan/UBSan tree, then runs each in turn on its
# seeds: the committed ones (fuzz/seeds/NAME/) and fresh ones the target writes
# with the project's encoders (FUZZ_WRITE_SEEDS_TO). A crash, leak, timeout or broken
# invariant fails the script and leaves the input in $FUZZ_BUILD_DIR/artifacts/NAME/.
# See docs/fuzzing.md.
#   FUZZ_SECONDS     total fuzzing time, split evenly between the targets (default 60)
#   FUZZ_RUNS        instead: this many executions per target (the long run)
#   FUZZ_TARGETS     which targets (default: all), e.g. "tcp_frames store_protocol"
#   FUZZ_BUILD_DIR   build directory (default build-fuzz)
#   FUZZ_WRITE_SEEDS =1: also rewrite the committed seeds from the encoders
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
ALL_TARGETS="tcp_frames store_protocol remote_key session_records ucx_am notify_ring graph_loader"
ALL_TARGETS+=" onnx_loader" # when the ONNX loader is built (libonnx-dev), else skipped below
TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"
read -r -a TARGET_LIST <<<"$TARGETS"

# Longest input per target: a few frames / records (the targets' limits are
# scaled down to match); longer inputs only slow each run down.
max_len() {
  case "$1" in
    remote_key) echo 512 ;;
    notify_ring) echo 1100 ;;
    graph_loader | onnx_loader) echo 8192 ;;
    *) echo 1024 ;;
  esac
}

echo "== fuzz: build ${#TARGET_LIST[@]} targets (clang, libFuzzer, ASan/UBSan) in $BUILD_DIR =="
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRDMAFLOW_FUZZ=ON -DRDMAFLOW_SANITIZE=ON -DRDMAFLOW_WERROR=OFF \
  -DRDMAFLOW_BUILD_TESTS=OFF -DRDMAFLOW_BUILD_BENCH=OFF -DRDMAFLOW_WITH_PYTHON=OFF \
  -DRDMAFLOW_WITH_UCX=OFF -DRDMAFLOW_WITH_VERBS=OFF -DRDMAFLOW_WITH_GRPC=OFF \
  -DRDMAFLOW_WITH_PMIX=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
if [[ " ${TARGET_LIST[*]} " == *" onnx_loader "* ]] &&
  ! grep -q '^fuzz_onnx_loader:' <(cmake --build "$BUILD_DIR" --target help 2>/dev/null); then
  echo "fuzz: no ONNX loader in this build (libonnx-dev missing): onnx_loader skipped"
  kept=()
  for t in "${TARGET_LIST[@]}"; do [ "$t" = onnx_loader ] || kept+=("$t"); done
  TARGET_LIST=("${kept[@]}")
fi
build_targets=()
for t in "${TARGET_LIST[@]}"; do build_targets+=("fuzz_$t"); done
cmake --build "$BUILD_DIR" --target "${build_targets[@]}" -j "${JOBS:-2}"

if [ -n "${FUZZ_RUNS:-}" ]; then
  budget=(-runs="$FUZZ_RUNS")
  echo "== fuzz: $FUZZ_RUNS executions per target =="
else
  each=$(( ${FUZZ_SECONDS:-60} / ${#TARGET_LIST[@]} ))
  [ "$each" -ge 1 ] || each=1
  budget=(-max_total_time="$each")
  echo "== fuzz: ${each}s per target =="
fi

SEEDS="$(mktemp -d)"
trap 'rm -rf "$SEEDS"' EXIT
for t in "${TARGET_LIST[@]}"; do
  seeds="$SEEDS/$t"
  corpus="$BUILD_DIR/corpus/$t"
  artifacts="$BUILD_DIR/artifacts/$t"
  mkdir -p "$seeds" "$corpus" "$artifacts" "$ROOT/fuzz/seeds/$t"
  cp "$ROOT/fuzz/seeds/$t/"* "$seeds/" 2>/dev/null || true
  if [ "$t" = graph_loader ]; then
    cp "$ROOT"/graph/examples/*.json "$ROOT"/tests/graph/data/*.json "$seeds"/
  elif [ "$t" = onnx_loader ]; then
    : # the committed models only (written by fuzz/make_onnx_seeds.py)
  else
    FUZZ_WRITE_SEEDS_TO="$seeds" "$BUILD_DIR/fuzz/fuzz_$t"
    [ "${FUZZ_WRITE_SEEDS:-0}" != 1 ] || FUZZ_WRITE_SEEDS_TO="$ROOT/fuzz/seeds/$t" "$BUILD_DIR/fuzz/fuzz_$t"
  fi
  echo "== fuzz: $t =="
  "$BUILD_DIR/fuzz/fuzz_$t" "${budget[@]}" -max_len="$(max_len "$t")" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$seeds" 2>&1 |
    tee "$BUILD_DIR/fuzz-$t.log" | grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs|stat::|==[0-9]+==ERROR|SUMMARY|fuzz invariant)' || true
  status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    tail -40 "$BUILD_DIR/fuzz-$t.log"
    echo "fuzz: $t FAILED (exit $status); the input is in $artifacts/" >&2
    exit 1
  fi
done
echo "fuzz: ${TARGET_LIST[*]} ran without finding a problem"
