#!/usr/bin/env bash
# Two soft-RoCE hosts: run in both guests of
#   scripts/softroce-vm --guests 2 -- bash scripts/softroce/two-guests.sh
# Guest i is rank i of a 2-rank job whose rendezvous is guest 0. Each has its
# own rxe device on eth0, and the two eth0s share one emulated Ethernet
# segment (10.77.0.0/24). It checks what a real two-host RoCE job depends on:
#  1. auto selection between the hosts picks verbs, because both RoCE GIDs sit
#     on one IPv4 subnet (and each rank chose the RoCE v2 IPv4 GID of its rxe0:
#     the guests also carry IPv6 GIDs, fe80:: and fd77::);
#  2. bench/p2p between the hosts over verbs and over tcp, each beside the
#     plain socket, with RDMAFLOW_TRANSPORT=auto's choice printed first;
#  3. with guest 1's address moved to another subnet (routed on the same
#     segment), auto no longer takes verbs ("different fabrics"), and verbs,
#     asked for, still connects and runs over routed RoCE v2.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
i="${RF_VM_INDEX:?run me through scripts/softroce-vm --guests 2}"
export RDMAFLOW_LOG_LEVEL="${RDMAFLOW_LOG_LEVEL:-info}"
# tcp listens on loopback unless told otherwise; verbs binds the GID's address either way.
export RDMAFLOW_SOCKET_IFNAME=eth0

p2p() {  # p2p OUT ERR ARGS...: bench/p2p, its output shown, its errors on failure
  local out="$1" err="$2"
  shift 2
  if ! "$BUILD/bench/p2p/p2p" "$@" >"$out" 2>"$err"; then
    cat "$out"
    echo "two-guests: p2p $* failed:" >&2
    tail -20 "$err" >&2
    exit 1
  fi
  cat "$out"
}

gid_of_choice() {  # what the backend logged as its GID choice
  grep -o 'GID index [0-9]* ([^)]*)' "$1" | head -1
}

echo "== guest $i: rxe0 GID table"
for f in /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/*; do
  n=${f##*/}
  t=$(cat "$f" 2>/dev/null) || continue
  echo "   index $n: $t $(cat /sys/class/infiniband/rxe0/ports/1/gids/"$n")"
done

echo "== guest $i: p2p between the guests (rank $i; rendezvous 10.77.0.1:29500)"
p2p /tmp/p2p.out /tmp/p2p.err --rank "$i" --rendezvous 10.77.0.1:29500 \
  --quick --lat-max 32768 --bw-max 4194304 --transport verbs --transport tcp
[ "$i" = 1 ] || grep -q 'RDMAFLOW_TRANSPORT=auto picks verbs' /tmp/p2p.out || {
  echo "two-guests: auto did not pick verbs between the guests:" >&2
  grep -i 'auto' /tmp/p2p.out /tmp/p2p.err >&2 || true
  exit 1
}
echo "   GID chosen: $(gid_of_choice /tmp/p2p.err)"
[ "$i" = 1 ] || echo "   (rank 0 prints the report; auto's choice comes from both ranks' records)"

echo "== guest $i: another subnet for guest 1 (10.77.1.2/24, routed on the segment)"
if [ "$i" = 1 ]; then
  ip addr del 10.77.0.2/24 dev eth0
  ip addr add 10.77.1.2/24 dev eth0
  ip route add 10.77.0.0/24 dev eth0
else
  ip route add 10.77.1.0/24 dev eth0
fi
sleep 2  # both sides moved before either connects
p2p /tmp/p2p2.out /tmp/p2p2.err --rank "$i" --rendezvous 10.77.0.1:29501 \
  --quick --transport verbs --lat-max 2048 --bw-max 65536
# The verbs rule no longer holds (two subnets are two fabrics); what auto takes
# instead depends on what else both ranks have (UCX's rc_verbs here, else tcp).
if [ "$i" = 0 ] && grep -q 'RDMAFLOW_TRANSPORT=auto picks verbs' /tmp/p2p2.out; then
  echo "two-guests: auto should not assume an RDMA path for verbs across subnets" >&2
  exit 1
fi
echo "two-guests: guest $i ok"
