#!/usr/bin/env bash
# Faults across hosts, each with bounded time, on the test cluster's 2 hosts
# (ranks started by hand with RDMAFLOW_RANK, so that a rank that fails or dies
# does not make a launcher kill the others):
#   partition  nftables drops everything between h0 and h1 in the middle of a
#              loop of allreduces (1 rank per host): each rank fails within its
#              3 s timeout, naming the other;
#   session    the same in the middle of a loop of Session steps (a ping-pong
#              plan: one one-sided write each way per step);
#   slow       the links at 100 Mbit/s under one 64 MiB allreduce with a 2 s
#              timeout that it outlasts: no false timeout while bytes move
#              (the timeout is about progress, not total time);
#   kill       SIGKILL of one of 4 ranks (2 hosts x 2) in the middle of a loop
#              of allreduces, FAULT_TRIALS times (default 3; docs/security.md
#              records 100): every survivor fails naming the dead rank, well
#              within its 20 s timeout.
# FAULT_SCENARIOS picks some (default "partition session slow kill").
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
command -v nft >/dev/null || skip "nft not found (Debian: nftables)"

CHECK="$BUILD/tests/cluster/fault_check"
TRIALS="${FAULT_TRIALS:-3}"
SCENARIOS="${FAULT_SCENARIOS:-partition session slow kill}"
work="$(mktemp -d "$BUILD/tests/cluster/faults.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  "${CLUSTER[@]}" exec h0 nft delete table inet rdmaflow_fault 2>/dev/null || true
  "${CLUSTER[@]}" up --hosts 2 --rate 10gbit >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
# start_ranks HOSTS...: rank i on host HOSTS[i], output in $work/rank<i>, pids in pids[].
start_ranks() {
  local world=$# i=0 h
  local -A size=() seen=()
  for h in "$@"; do size[$h]=$((${size[$h]:-0} + 1)); done
  port=$((port + 1))
  pids=()
  for h in "$@"; do
    RDMAFLOW_RANK=$i RDMAFLOW_WORLD_SIZE=$world RDMAFLOW_LOCAL_RANK=${seen[$h]:-0} \
      RDMAFLOW_LOCAL_SIZE=${size[$h]} RDMAFLOW_RENDEZVOUS="10.77.$ID.10:$port" \
      "${CLUSTER[@]}" exec "$h" "$CHECK" "${ARGS[@]}" >"$work/rank$i" 2>&1 &
    pids+=($!)
    seen[$h]=$((${seen[$h]:-0} + 1))
    i=$((i + 1))
  done
}
# wait_all SECONDS: waits for every rank; fails the test if one is still running then.
wait_all() {
  local until=$((SECONDS + $1)) p
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      [ $SECONDS -lt $until ] || fail "a rank still runs $1 s after the fault: $(cat "$work"/rank*)"
      sleep 0.1
    done
  done
}
wait_running() {
  local i until=$((SECONDS + 60))
  for ((i = 0; i < $1; i++)); do
    until grep -q "running" "$work/rank$i" 2>/dev/null; do
      [ $SECONDS -lt $until ] || fail "rank $i did not start: $(cat "$work"/rank*)"
      grep -q "setup failed" "$work/rank$i" 2>/dev/null && fail "rank $i: $(cat "$work/rank$i")"
      sleep 0.05
    done
  done
}
# expect_failed RANK PEER: the rank's line says it failed naming PEER.
expect_failed() {
  grep -q "fault_check rank $1: failed: peer $2," "$work/rank$1" ||
    fail "rank $1 did not fail naming rank $2: $(cat "$work/rank$1")"
}

# partition [--session]: allreduces, or Session steps.
partition() {
  ARGS=(--count 262144 --seconds 60 --timeout-ms 3000 "$@")
  start_ranks h0 h1
  wait_running 2
  sleep 0.5
  local t0=$SECONDS
  "${CLUSTER[@]}" exec h0 nft -f - <<EOF
table inet rdmaflow_fault {
  chain in { type filter hook input priority 0; ip saddr 10.77.$ID.11 drop; }
  chain out { type filter hook output priority 0; ip daddr 10.77.$ID.11 drop; }
}
EOF
  wait_all 20
  expect_failed 0 1
  expect_failed 1 0
  grep -h "failed" "$work"/rank*
  echo "partition ${1:-}: both ranks failed $((SECONDS - t0)) s after the cut (timeout 3 s)"
  "${CLUSTER[@]}" exec h0 nft delete table inet rdmaflow_fault
}

slow() {
  "${CLUSTER[@]}" up --hosts 2 --rate 100mbit >/dev/null
  ARGS=(--count 16777216 --calls 1 --timeout-ms 2000 --seconds 120)
  start_ranks h0 h1
  wait_all 120
  "${CLUSTER[@]}" up --hosts 2 --rate 10gbit >/dev/null
  local i took
  for i in 0 1; do
    grep -q "fault_check rank $i: ok: 1 calls" "$work/rank$i" ||
      fail "64 MiB allreduce at 100 Mbit/s with a 2 s timeout: $(cat "$work/rank$i")"
    took="$(sed -n 's/.*the longest \([0-9]*\) ms/\1/p' "$work/rank$i")"
    [ "$took" -gt 2000 ] || fail "the call took $took ms, not longer than its timeout: the test proves nothing"
  done
  echo "slow: 64 MiB allreduce at 100 Mbit/s took $took ms with a 2000 ms timeout, no false timeout"
}

kill_one() {
  local trial victim r after worst
  ARGS=(--count 262144 --seconds 60 --timeout-ms 20000)
  for ((trial = 1; trial <= TRIALS; trial++)); do
    rm -f "$work"/rank*
    start_ranks h0 h0 h1 h1
    wait_running 4
    victim=$((RANDOM % 4))
    sleep "0.$((RANDOM % 10))"
    kill -9 "${pids[$victim]}"
    wait "${pids[$victim]}" 2>/dev/null || true
    wait_all 15
    worst=0
    for r in 0 1 2 3; do
      [ "$r" = "$victim" ] && continue
      expect_failed "$r" "$victim"
      after="$(sed -n 's/.*calls, \([0-9]*\) ms after the last good one.*/\1/p' "$work/rank$r")"
      [ "$after" -lt 10000 ] || fail "trial $trial: rank $r failed $after ms after its last good call"
      [ "$after" -gt "$worst" ] && worst=$after
    done
    echo "kill trial $trial: rank $victim killed; the 3 survivors named it, the last $worst ms after its last good call"
  done
}

for s in $SCENARIOS; do
  case "$s" in
    partition) partition ;;
    session) partition --session ;;
    slow) slow ;;
    kill) kill_one ;;
    *) fail "unknown scenario $s" ;;
  esac
done
echo "cluster.faults: ok ($SCENARIOS)"
