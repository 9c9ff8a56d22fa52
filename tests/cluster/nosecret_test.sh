#!/usr/bin/env bash
# A two-host job without a job secret refuses to start (docs/security.md "The
# job secret"): one rank on h0, one on h1, started by hand with the cluster's
# secret taken away (`env -u`: the cluster's exec hands jobs its own
# otherwise), per transport (tcp, ucx). Each rank must exit non-zero within its
# 3 s timeout (bounded by 20 s here) and print the advice naming the other
# host's address: rank 1 is refused by its own side when connecting to rank 0's
# store on h0, and rank 0's store refuses rank 1's connection from h1. Then
# the same job with RDMAFLOW_AUTH=0 on both ranks (the explicit opt-out) runs.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up

CHECK="$BUILD/tests/cluster/cluster_check"
work="$(mktemp -d "$BUILD/tests/cluster/nosecret.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

H0="10.77.$ID.10"
H1="10.77.$ID.11"
port=$((20000 + RANDOM % 20000))
ADVICE="no job secret is configured"
HOW="give every rank the same RDMAFLOW_JOB_SECRET_FILE (or RDMAFLOW_JOB_SECRET), or set RDMAFLOW_AUTH=0"

# run_job TRANSPORT BOUND [VAR=VALUE...]: rank 0 on h0, rank 1 on h1, without
# the cluster's secret; output in $work/rank<i>, exit codes in rc[i]; fails the
# test if a rank is still running BOUND seconds later.
run_job() {
  local transport=$1 bound=$2 i h
  shift 2
  port=$((port + 1))
  pids=()
  for i in 0 1; do
    h=h$i
    RDMAFLOW_RANK=$i RDMAFLOW_WORLD_SIZE=2 RDMAFLOW_LOCAL_RANK=0 RDMAFLOW_LOCAL_SIZE=1 \
      RDMAFLOW_RENDEZVOUS="$H0:$port" RDMAFLOW_TRANSPORT=$transport RDMAFLOW_TIMEOUT_MS=3000 \
      "${CLUSTER[@]}" exec "$h" env -u RDMAFLOW_JOB_SECRET_FILE -u RDMAFLOW_JOB_SECRET "$@" \
      timeout "$bound" "$CHECK" >"$work/rank$i" 2>&1 &
    pids+=($!)
  done
  rc=()
  for i in 0 1; do
    rc[i]=0
    wait "${pids[$i]}" || rc[i]=$?
  done
  pids=()
  for i in 0 1; do
    [ "${rc[$i]}" != 124 ] || fail "$transport: rank $i still ran after $bound s: $(cat "$work/rank$i")"
  done
}

for transport in tcp ucx; do
  t0=$SECONDS
  run_job "$transport" 20
  took=$((SECONDS - t0))
  # expect RANK PEER_ADDRESS: the rank failed with the advice naming the peer's address.
  for i in 0 1; do
    peer=$([ $i = 0 ] && echo "$H1" || echo "$H0")
    [ "${rc[$i]}" != 0 ] || fail "$transport: rank $i started without a secret: $(cat "$work/rank$i")"
    grep -q "$peer:[0-9]* is on another host: $ADVICE" "$work/rank$i" ||
      fail "$transport: rank $i does not name $peer with the advice: $(cat "$work/rank$i")"
    grep -qF "$HOW" "$work/rank$i" || fail "$transport: rank $i does not say how: $(cat "$work/rank$i")"
    grep -h "is on another host" "$work/rank$i" | head -1
  done
  echo "$transport without a secret: both ranks refused, naming the other host, in $took s"

  t0=$SECONDS
  run_job "$transport" 60 RDMAFLOW_AUTH=0 RDMAFLOW_TIMEOUT_MS=20000
  for i in 0 1; do
    { [ "${rc[$i]}" = 0 ] && grep -q "cluster_check: ok" "$work/rank$i"; } ||
      fail "$transport with RDMAFLOW_AUTH=0: rank $i exited ${rc[$i]}: $(cat "$work/rank$i")"
    grep -q "rank $i on h$i: rank $((1 - i)) on h$((1 - i)): $transport over" "$work/rank$i" ||
      fail "with RDMAFLOW_AUTH=0: rank $i did not reach the other host over $transport: $(cat "$work/rank$i")"
  done
  grep -h "over" "$work/rank0"
  echo "$transport with RDMAFLOW_AUTH=0: the job ran in $((SECONDS - t0)) s"
done
echo "cluster.nosecret: ok"
