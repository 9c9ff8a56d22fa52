#!/usr/bin/env bash
# rdmaflow's auto selection on 2 ranks of h0 and 1 of h1, launched by mpirun:
# shared memory within h0, the network between the hosts, as the library
# reports them (cluster_check --expect-split fails otherwise); then a mesh check
# and allreduces over that mix.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun
out="$(RDMAFLOW_TRANSPORT=auto timeout 100 mpirun "${MPIRUN_ARGS[@]}" -H h0:2,h1:1 -np 3 \
  "$BUILD/tests/cluster/cluster_check" --expect-split 2>&1)" || fail "cluster_check: $out"
echo "$out"
grep -q "rank 0 on h0: rank 1 on h0: .* over shared memory" <<<"$out" ||
  fail "ranks 0 and 1 (both on h0) not over shared memory"
grep -q "rank 0 on h0: rank 2 on h1: tcp over socket" <<<"$out" ||
  fail "ranks 0 (h0) and 2 (h1) not over tcp"
[ "$(grep -c 'cluster_check: ok' <<<"$out")" -eq 3 ] || fail "not every rank passed"
