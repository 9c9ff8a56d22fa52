#!/usr/bin/env bash
# A flat ring across 2 hosts x 2 ranks, many calls back to back: each rank
# has one same-host peer (the direct path) and one on the other host (tcp),
# and its tcp link forward carries only its pieces, which are posted writes;
# nothing comes back on that link but the peer's credits, held and sent late,
# so the tcp ticker's sweep is often what completes them. Its ticker stopping with such a write outstanding (it did, between
# the last look and the stop) left every rank asleep with every socket empty
# (crowded ranks: mpi_yield_when_idle) until the deadline: 4 of 9 runs of
# 3000 calls at 64 KiB before the fix.
# Three runs here, each within a 10 s collective deadline.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun
bench="$BUILD/bench/collectives/rdmaflow_coll_bench"
[ -x "$bench" ] || skip "$bench is not built (RDMAFLOW_BUILD_BENCH=OFF)"
for run in 1 2 3; do
  out="$(RDMAFLOW_TIMEOUT_MS=10000 timeout 100 mpirun "${MPIRUN_ARGS[@]}" -x RDMAFLOW_TIMEOUT_MS \
    --mca mpi_yield_when_idle 1 -H h0:2,h1:2 -np 4 "$bench" --op allreduce --algo ring --sizes 64K -n 3000 2>&1)" ||
    fail "ring at 64 KiB, 3000 calls (run $run): $out"
  awk '$1 == 65536 && $5 == "ring" && $10 == 0 { ok = 1 } END { exit !ok }' <<<"$out" ||
    fail "no 64 KiB ring row without wrong elements (run $run): $out"
done
echo "cluster.ring_mixed: ok"
