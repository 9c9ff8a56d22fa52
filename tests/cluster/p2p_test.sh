#!/usr/bin/env bash
# bench/p2p between h0 and h1 under mpirun, as scripts/cluster-bench runs it
# (no --rendezvous: rank 0's out-of-band socket is found through the launcher),
# quick and small: the JSON must say the ranks are on two hosts and carry, at
# every size, the plain-socket and gRPC references and the link rate measured
# in the run.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
require_mpirun
P2P="$BUILD/bench/p2p/p2p"
[ -x "$P2P" ] || skip "bench/p2p is not built (RDMAFLOW_BUILD_BENCH=OFF?)"
command -v python3 >/dev/null || skip "python3 not found (it reads the report)"

# Under the build tree: rank 0 writes it on h0, whose /tmp is its own.
json="$BUILD/tests/cluster/p2p_test.json"
rm -f "$json"
out="$(timeout 100 mpirun "${MPIRUN_ARGS[@]}" -H h0:1,h1:1 -np 2 "$P2P" --quick --transport tcp \
  --lat-max 4K --bw-max 1M --seconds 0.02 --link-seconds 0.3 --json-file "$json" 2>&1)" ||
  fail "p2p across the hosts: $out"
echo "$out"
python3 - "$json" <<'PY' || fail "the report lacks a reference (above)"
import json, sys
d = json.load(open(sys.argv[1]))
problems = []
if d.get("hosts") != ["h0", "h1"] or d.get("across_hosts") is not True:
    problems.append(f"ranks not on h0 and h1: hosts {d.get('hosts')}, across {d.get('across_hosts')}")
link = d.get("link_rate", {})
if not (link.get("single_stream_MBps", 0) > 0 and link.get("multi_stream_MBps", 0) > 0):
    problems.append(f"no link rate: {link}")
if link.get("from") != "h0" or link.get("to") != "h1":
    problems.append(f"link rate not measured from h0 to h1: {link}")
rows = [r for r in d.get("rows", []) if r.get("transport") == "tcp"]
if len(rows) != 1 or "skipped" in rows[0]:
    problems.append(f"no tcp row: {d.get('rows')}")
else:
    tcp = rows[0]
    if tcp.get("medium") != "socket":
        problems.append(f"tcp medium is {tcp.get('medium')}")
    for table in ("latency_us", "bandwidth_MBps"):
        if not tcp.get(table):
            problems.append(f"tcp has no {table}")
        for r in tcp.get(table, []):
            for key in ("transport", "socket", "grpc"):
                if not r.get(key, 0) > 0:
                    problems.append(f"{table} at {r.get('size')} B: no {key} figure")
    for r in tcp.get("bandwidth_MBps", []):
        if not r.get("ratio_link", 0) > 0:
            problems.append(f"bandwidth at {r.get('size')} B: no share of the link rate")
print("\n".join(problems) if problems else "p2p report: hosts, link rate, socket and gRPC references present")
sys.exit(1 if problems else 0)
PY
rm -f "$json"
echo "cluster.p2p: ok"
