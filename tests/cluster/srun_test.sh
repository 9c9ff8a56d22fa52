#!/usr/bin/env bash
# Slurm on the hosts (munged, slurmctld, a slurmd per host): srun launches one
# job of 4 tasks on 2 nodes that bootstraps from Slurm's variables alone (the
# rendezvous on the first node of the step), then one through PMIx.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
for tool in munged slurmctld slurmd srun; do
  command -v "$tool" >/dev/null || skip "$tool not found (Debian: slurm-wlm munge)"
done
trap '"${CLUSTER[@]}" slurm down >/dev/null 2>&1 || true' EXIT
eval "$("${CLUSTER[@]}" slurm up)"
[ -n "${SLURM_CONF:-}" ] || fail "slurm up printed no SLURM_CONF"

names="$(timeout 60 srun -N 2 -n 4 --overcommit hostname 2>&1 | sort | tr '\n' ' ')"
[ "$names" = "h0 h0 h1 h1 " ] || fail "srun hostname printed: $names"

out="$(env -u RDMAFLOW_RENDEZVOUS timeout 100 srun -N 2 -n 4 --overcommit \
  "$BUILD/tests/cluster/cluster_check" 2>&1)" || fail "cluster_check under srun: $out"
echo "$out" | grep "cluster_check: ok"
[ "$(grep -c 'cluster_check: ok' <<<"$out")" -eq 4 ] || fail "not every task passed: $out"
grep -q "Slurm (SLURM_PROCID" <<<"$out" || fail "ranks not from Slurm's variables: $out"

if srun --mpi=list 2>&1 | grep -qw pmix; then
  out="$(env -u RDMAFLOW_RENDEZVOUS timeout 100 srun --mpi=pmix -N 2 -n 2 \
    "$BUILD/tests/cluster/cluster_check" 2>&1)" || fail "cluster_check under srun --mpi=pmix: $out"
  [ "$(grep -c 'cluster_check: ok' <<<"$out")" -eq 2 ] || fail "srun --mpi=pmix: $out"
fi
echo "cluster.srun: ok"
