#!/usr/bin/env bash
# The main job: installs the Debian packages, builds, and runs the
# point-to-point benchmark between two local processes (every available
# transport beside its plain-socket / memcpy reference).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh
BUILD_DIR="$ROOT/build" bash scripts/build.sh
"$ROOT/build/bench/p2p/p2p" "$@"
