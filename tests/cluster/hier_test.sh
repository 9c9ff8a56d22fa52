#!/usr/bin/env bash
# The hierarchical collectives across 2 hosts x 2 ranks under mpirun: the
# communicator's host groups are 2 of 2 and match the hostnames, and forced
# hier allreduce (reduce-scatter within h0 and h1, lanes between them,
# allgather within), reduce_scatter, allgather, broadcast and reduce (roots
# other than 0) are correct and barriers pass; again with the same-host direct
# path off, which the host groups do not depend on; with the mixed wait
# (RDMAFLOW_COLL_MIXED_WAIT=1: one ppoll over the tcp sockets and the wake
# socket same-host peers ring), which every rank must then use; and crowded
# (mpi_yield_when_idle, as the benchmarks run 4 ranks on 2 cores), where
# every rank polls the tcp sockets beside the direct words by default
# (RDMAFLOW_COLL_MIXED_POLL).
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun
for mode in "1 0 0 polling" "0 0 0 polling" "1 1 0 one ppoll" "1 0 1 sockets polled beside the words"; do
  read -r direct mixed yield want <<<"$mode"
  env="RDMAFLOW_COLL_DIRECT=$direct RDMAFLOW_COLL_MIXED_WAIT=$mixed mpi_yield_when_idle=$yield"
  out="$(RDMAFLOW_COLL_DIRECT=$direct RDMAFLOW_COLL_MIXED_WAIT=$mixed timeout 100 \
    mpirun "${MPIRUN_ARGS[@]}" -x RDMAFLOW_COLL_DIRECT -x RDMAFLOW_COLL_MIXED_WAIT \
    --mca mpi_yield_when_idle "$yield" -H h0:2,h1:2 -np 4 \
    "$BUILD/tests/cluster/cluster_check" --algo hier --expect-hosts "2 hosts x 2 ranks" 2>&1)" ||
    fail "cluster_check --algo hier ($env): $out"
  echo "$out" | grep "cluster_check: ok"
  [ "$(grep -c 'host groups 2 hosts x 2 ranks, allreduce\[hier\]' <<<"$out")" -eq 4 ] ||
    fail "not every rank ran hier over 2 hosts x 2 ranks ($env): $out"
  [ "$(grep -c 'reduce_scatter, allgather, broadcast, reduce and barrier\[hier\] correct' \
    <<<"$out")" -eq 4 ] ||
    fail "not every rank ran every hier collective ($env): $out"
  [ "$(grep -c "mixed wait: $want" <<<"$out")" -eq 4 ] ||
    fail "not every rank waited by $want ($env): $out"
done
echo "cluster.hier: ok"
