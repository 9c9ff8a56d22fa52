#!/usr/bin/env bash
# Every test: installs the Debian packages, builds, runs the whole ctest suite,
# then a short libFuzzer run of every decoder (scripts/fuzz.sh) and the format check.
# Usage: scripts/run-tests.sh   (as root on Debian 12; CI runs exactly this)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh

echo "== build (RelWithDebInfo, -Werror) =="
BUILD_DIR="$ROOT/build" bash scripts/build.sh

echo "== ctest =="
(cd "$ROOT/build" && ctest --output-on-failure -j 2 --timeout 600)

echo "== fuzz smoke run, every decoder (clang libFuzzer + ASan/UBSan) =="
FUZZ_SECONDS="${FUZZ_SECONDS:-60}" bash scripts/fuzz.sh

echo "== format check =="
bash scripts/check-format.sh
