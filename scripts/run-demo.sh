#!/usr/bin/env bash
# The main job: installs the Debian packages, builds, and runs the end-to-end
# demo: 4 local processes train an MLP with parameter servers over the
# auto-chosen transport, over rdmaflow's tcp and over the gRPC baseline, print
# the loss curves, a table of step time / medium / bytes per step / speedup
# (headline: tcp vs gRPC, both over sockets), and check the trained weights
# against a single-process run. Extra arguments go to rdmaflow-demo (--help).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh
BUILD_DIR="$ROOT/build" bash scripts/build.sh
exec "$ROOT/build/bench/e2e/rdmaflow-demo" "$@"
