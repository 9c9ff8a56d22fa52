#!/usr/bin/env bash
# A 2-host cluster comes up (twice: up is idempotent) and its hosts are hosts:
# own hostname, own /dev/shm, own IPC namespace, names that resolve, a link to
# the other host and to this machine, tbf at the rate asked for, TCP metrics
# not carried from one connection to the next, Debian's congestion control.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster

"${CLUSTER[@]}" down >/dev/null 2>&1 || true
"${CLUSTER[@]}" up --hosts 2 --rate 1gbit
"${CLUSTER[@]}" up --hosts 2 --rate 10gbit
"${CLUSTER[@]}" status || fail "status after up"
status="$("${CLUSTER[@]}" status)"
[ "$(grep -c ' up$' <<<"$status")" -eq 2 ] || fail "two hosts up expected: $status"
grep -q '10Gbit *10Gbit' <<<"$status" || fail "tbf at 10gbit both ways expected: $status"

x() { "${CLUSTER[@]}" exec "$@"; }
for k in 0 1; do
  [ "$(x h$k hostname)" = "h$k" ] || fail "h$k's hostname is $(x h$k hostname)"
done
[ "$(x h0 readlink /proc/self/ns/ipc)" != "$(x h1 readlink /proc/self/ns/ipc)" ] ||
  fail "h0 and h1 share an IPC namespace"
[ "$(x h0 readlink /proc/self/ns/ipc)" != "$(readlink /proc/self/ns/ipc)" ] ||
  fail "h0 shares this machine's IPC namespace"
marker="rdmaflow-cluster-test-$$"
x h0 touch "/dev/shm/$marker"
x h1 test ! -e "/dev/shm/$marker" || fail "h1 sees h0's /dev/shm"
test ! -e "/dev/shm/$marker" || fail "this machine sees h0's /dev/shm"
x h0 rm "/dev/shm/$marker"
[ "$(x h0 getent hosts h1 | awk '{print $1}')" = "10.77.$ID.11" ] || fail "h1 does not resolve on h0"
[[ "$(x h0 ip -o addr show lo)" == *"inet 127.0.0.1/"* ]] || fail "loopback not up on h0"
# Each run's connections start from the kernel's defaults, not from the
# per-destination metrics earlier connections saved (docs/cluster.md).
for k in 0 1; do
  [ "$(x h$k cat /proc/sys/net/ipv4/tcp_no_metrics_save)" = 1 ] ||
    fail "h$k saves TCP metrics (net.ipv4.tcp_no_metrics_save is not 1)"
  cc="$(x h$k cat /proc/sys/net/ipv4/tcp_congestion_control)"
  [ "$cc" = cubic ] || fail "h$k's congestion control is $cc, not Debian's cubic"
done

# TCP across the bridge: h1 listens, h0 and this machine connect. The helper
# lives in the build tree: each host has a /tmp of its own.
work="$BUILD/tests/cluster/up_test.tmp"
mkdir -p "$work"
cat >"$work/tcp.py" <<'PY'
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5999)); s.listen(); s.settimeout(20)
    for _ in range(2):
        c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()
else:
    for _ in range(200):
        try:
            c = socket.create_connection((sys.argv[1], 5999), timeout=5); break
        except OSError:
            time.sleep(0.05)
    print(c.recv(16).decode())
PY
x h1 python3 "$work/tcp.py" serve &
listener=$!
[ "$(x h0 python3 "$work/tcp.py" h1)" = h1 ] || fail "h0 cannot reach h1 by name"
[ "$(python3 "$work/tcp.py" "10.77.$ID.11")" = h1 ] || fail "this machine cannot reach h1"
wait "$listener"
rm -rf "$work"
echo "cluster.up: 2 hosts up, isolated and linked"
