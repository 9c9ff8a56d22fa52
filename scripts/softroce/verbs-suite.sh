#!/usr/bin/env bash
# The verbs rows of the test suite, run where an RDMA device exists (inside the
# soft-RoCE guest: scripts/softroce-vm -- bash scripts/softroce/verbs-suite.sh).
# A verbs row that skips is a failure here: the device is there.
#
#   verbs-suite.sh            the smoke (ctest label softroce, in CI): every verbs
#                             row of the conformance, verbs, session, selection
#                             and collectives tests, ~2 min in an emulated guest
#   verbs-suite.sh --build-dir DIR   another build tree (inside the repository)
#   verbs-suite.sh --full     also the collectives matrix over verbs (worlds 1-4)
#                             and the e2e demo with RDMAFLOW_TRANSPORT=verbs
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
FULL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --full) FULL=1; shift ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    *) echo "verbs-suite: unknown argument $1 (--full, --build-dir DIR)" >&2; exit 2 ;;
  esac
done

[ -d /sys/class/infiniband ] && [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ] || {
  echo "verbs-suite: no RDMA device here; run it through scripts/softroce-vm" >&2
  exit 2
}

failed=()
start=$(date +%s)
# gtest BINARY FILTER: runs it, fails on a failure or on any skipped test.
gtest() {
  local bin="$1" filter="$2" out t0
  t0=$(date +%s)
  echo "== ${bin#"$BUILD"/} --gtest_filter=$filter"
  out=$("$BUILD/$bin" --gtest_filter="$filter" 2>&1)
  local rc=$?
  echo "$out" | grep -E '^\[ +(FAILED|SKIPPED|PASSED) +\]|Failure|rank [0-9]+:' | sed 's/^/   /'
  if [ $rc -ne 0 ]; then
    failed+=("$bin")
    echo "$out" | tail -40 | sed 's/^/   | /'
  elif echo "$out" | grep -q '^\[  SKIPPED \]'; then
    failed+=("$bin (skipped rows)")
  fi
  echo "   ($(($(date +%s) - t0)) s)"
}

gtest tests/transport/conformance_test '*/verbs'
gtest tests/verbs/verbs_unit_test '*'
# The no-device check is the host's; here the device exists.
gtest tests/verbs/verbs_device_test '*-VerbsViability.NoDeviceMeansNotViableWithTheReason'
gtest tests/verbs/verbs_loopback_test '*'
gtest tests/verbs/verbs_raw_peer_test '*'
gtest tests/session/session_test '*/verbs'
gtest tests/session/session_transport_select_test 'SelectTransports.RequestedVerbs*:DecidePair.*'
gtest tests/collectives/collectives_test '*/verbs'
gtest tests/collectives/collectives_bind_test '*/verbs'

if [ "$FULL" = 1 ]; then
  gtest tests/collectives/collectives_matrix_test '*verbs*'
  echo "== e2e demo over verbs (4 ranks; weights checked against one process)"
  if ! "$BUILD/bench/e2e/rdmaflow-demo" --transports verbs 2>&1 | sed 's/^/   /'; then
    failed+=("rdmaflow-demo")
  fi
fi

echo "verbs-suite: $(($(date +%s) - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'verbs-suite: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "verbs-suite: every verbs row passed, none skipped"
