# shellcheck shell=bash disable=SC2034  # SRC, BUILD, MPIRUN_ARGS are for the tests
# Shared by the cluster tests (sourced): arguments SOURCE_DIR BUILD_DIR.
set -euo pipefail
SRC="$1"
BUILD="$2"
ID=9
CLUSTER=("$SRC/scripts/cluster" --id "$ID")
AGENT="$SRC/scripts/cluster --id $ID rsh"

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Skips with the reason when this machine cannot make namespaces.
require_cluster() {
  local why
  why="$("${CLUSTER[@]}" check 2>&1)" || skip "${why#cluster: }"
}

require_cluster_up() {
  require_cluster
  "${CLUSTER[@]}" status >/dev/null || fail "cluster $ID is not up (cluster.up failed?)"
}

require_mpirun() {
  command -v mpirun >/dev/null || skip "mpirun not found (Debian: openmpi-bin)"
}

# mpirun from this machine's own namespaces onto the hosts, as docs/cluster.md says.
MPIRUN_ARGS=(--allow-run-as-root --bind-to none --mca plm_rsh_agent "$AGENT"
  --mca oob_tcp_if_include "10.77.$ID.0/24" --mca btl_tcp_if_include "10.77.$ID.0/24")
