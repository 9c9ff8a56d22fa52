#!/usr/bin/env bash
# The hierarchical collectives across 2 hosts x 2 ranks under mpirun: the
# communicator's host groups are 2 of 2 and match the hostnames, and forced
# hier allreduce (reduce-scatter within h0 and h1, lanes between them,
# allgather within), reduce_scatter, allgather, broadcast and reduce (roots
# other than 0) are correct and barriers pass; again with the same-host direct
# path off, which the host groups do not depend on.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun
for direct in 1 0; do
  out="$(RDMAFLOW_COLL_DIRECT=$direct timeout 100 mpirun "${MPIRUN_ARGS[@]}" -H h0:2,h1:2 -np 4 \
    "$BUILD/tests/cluster/cluster_check" --algo hier --expect-hosts "2 hosts x 2 ranks" 2>&1)" ||
    fail "cluster_check --algo hier (RDMAFLOW_COLL_DIRECT=$direct): $out"
  echo "$out" | grep "cluster_check: ok"
  [ "$(grep -c 'host groups 2 hosts x 2 ranks, allreduce\[hier\]' <<<"$out")" -eq 4 ] ||
    fail "not every rank ran hier over 2 hosts x 2 ranks (RDMAFLOW_COLL_DIRECT=$direct): $out"
  [ "$(grep -c 'reduce_scatter, allgather, broadcast, reduce and barrier\[hier\] correct' \
    <<<"$out")" -eq 4 ] ||
    fail "not every rank ran every hier collective (RDMAFLOW_COLL_DIRECT=$direct): $out"
done
echo "cluster.hier: ok"
