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
#     segment), auto no longer assumes an RDMA path ("different fabrics": tcp),
#     and RDMAFLOW_TRANSPORT=verbs still connects over routed RoCE v2.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
i="${RF_VM_INDEX:?run me through scripts/softroce-vm --guests 2}"
peer_ip=10.77.0.$((2 - i))
export RDMAFLOW_LOG_LEVEL="${RDMAFLOW_LOG_LEVEL:-info}"

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
"$BUILD/bench/p2p" --rank "$i" --rendezvous 10.77.0.1:29500 --host 10.77.0.1 --quick \
  --transport verbs --transport tcp 2>/tmp/p2p.err | tee /tmp/p2p.out
grep -q 'RDMAFLOW_TRANSPORT=auto picks verbs' /tmp/p2p.out || {
  echo "two-guests: auto did not pick verbs between the guests:" >&2
  grep -i 'auto' /tmp/p2p.out /tmp/p2p.err >&2 || true
  exit 1
}
echo "   GID chosen: $(gid_of_choice /tmp/p2p.err)"

echo "== guest $i: another subnet for guest 1 (10.77.1.2/24, routed on the segment)"
if [ "$i" = 1 ]; then
  ip addr del 10.77.0.2/24 dev eth0
  ip addr add 10.77.1.2/24 dev eth0
  ip route add 10.77.0.0/24 dev eth0
else
  ip route add 10.77.1.0/24 dev eth0
fi
sleep 2  # both sides moved before either connects
peer_ip=$([ "$i" = 0 ] && echo 10.77.1.2 || echo 10.77.0.1)
ping -c 1 -W 5 "$peer_ip" >/dev/null || { echo "two-guests: $peer_ip unreachable" >&2; exit 1; }
"$BUILD/bench/p2p" --rank "$i" --rendezvous 10.77.0.1:29501 --host 10.77.0.1 --quick \
  --transport verbs --lat-max 2048 --bw-max 65536 2>/tmp/p2p2.err | tee /tmp/p2p2.out
grep -q 'RDMAFLOW_TRANSPORT=auto picks tcp' /tmp/p2p2.out || {
  echo "two-guests: auto should not assume RDMA across subnets:" >&2
  grep -i 'auto' /tmp/p2p2.out /tmp/p2p2.err >&2 || true
  exit 1
}
echo "two-guests: guest $i ok"
