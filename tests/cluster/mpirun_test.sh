#!/usr/bin/env bash
# mpirun across the hosts, through the rsh agent, from this machine's own
# namespaces and from h0: the hosts' own names, rdmaflow's rendezvous found
# through PMIx with no variable of ours, a mesh check and allreduces; and Open
# MPI's own TCP path between the hosts.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun

names="$(timeout 60 mpirun "${MPIRUN_ARGS[@]}" -H h0:2,h1:2 -np 4 hostname 2>&1 | sort | tr '\n' ' ')"
[ "$names" = "h0 h0 h1 h1 " ] || fail "mpirun hostname printed: $names"

# No RDMAFLOW_* variable at all: rank, world and rendezvous come from the launcher.
run_check() {
  env -u RDMAFLOW_RENDEZVOUS -u RDMAFLOW_TRANSPORT -u RDMAFLOW_SOCKET_IFNAME "$@"
}
out="$(run_check timeout 100 mpirun "${MPIRUN_ARGS[@]}" -H h0:2,h1:2 -np 4 \
  "$BUILD/tests/cluster/cluster_check" 2>&1)" || fail "cluster_check from this machine: $out"
echo "$out" | grep "cluster_check: ok"
[ "$(grep -c 'cluster_check: ok' <<<"$out")" -eq 4 ] || fail "not every rank passed: $out"
grep -q "rendezvous 10.77.$ID.10:" <<<"$out" || fail "rendezvous not on h0's address: $out"

out="$(run_check timeout 100 "${CLUSTER[@]}" exec h0 mpirun "${MPIRUN_ARGS[@]}" -H h0:2,h1:2 -np 4 \
  "$BUILD/tests/cluster/cluster_check" 2>&1)" || fail "cluster_check from h0: $out"
[ "$(grep -c 'cluster_check: ok' <<<"$out")" -eq 4 ] || fail "not every rank passed from h0: $out"

if [ -x "$BUILD/tests/cluster/mpi_allreduce_check" ]; then
  out="$(timeout 100 mpirun "${MPIRUN_ARGS[@]}" --mca btl tcp,self,vader -H h0:2,h1:2 -np 4 \
    "$BUILD/tests/cluster/mpi_allreduce_check" 2>&1)" || fail "Open MPI allreduce: $out"
  echo "$out"
  [ "$(grep -c 'allreduce ok' <<<"$out")" -eq 4 ] || fail "Open MPI allreduce: $out"
  grep -q "on h1" <<<"$out" || fail "no rank on h1: $out"
fi
echo "cluster.mpirun: ok"
