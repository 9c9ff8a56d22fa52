#!/usr/bin/env bash
# scripts/iperf-ring on the test cluster's two hosts (h0 sends to h1 and h1
# to h0, at once), as the targets run calls it: each flow's rate in the JSON,
# above zero and not above the link's rate, the slowest and the mean among
# them; and the mistakes a caller can make (no --id, an unknown host, one
# host) refused with exit 2 and a message naming them, leaving no iperf3
# server behind.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster_up
command -v iperf3 >/dev/null || skip "iperf3 not found (Debian: iperf3)"
command -v python3 >/dev/null || skip "python3 not found (it reads the JSON)"
RING="$SRC/scripts/iperf-ring"

json="$BUILD/tests/cluster/iperf_ring_test.json"
rm -f "$json"
out="$(timeout 60 "$RING" --id "$ID" --hosts h0,h1 --seconds 1 --port 5298 --json "$json" 2>&1)" ||
  fail "iperf-ring on h0,h1: $out"
echo "$out"
grep -q "^iperf3 ring of 2 hosts, 1 s, all at once: the slowest [0-9]* MB/s" <<<"$out" ||
  fail "no summary line in: $out"
python3 - "$json" <<'PY' || fail "the JSON is wrong (above)"
import json, sys
d = json.load(open(sys.argv[1]))
flows = d.get("flows", [])
problems = []
if [(f.get("host"), f.get("to")) for f in flows] != [("h0", "h1"), ("h1", "h0")]:
    problems.append(f"flows not h0->h1 and h1->h0: {flows}")
link = d.get("link_MBps") or 0
for f in flows:
    if not 0 < f.get("MBps", 0) <= link * 1.02:
        problems.append(f"{f.get('host')}: {f.get('MBps')} MB/s, link {link} MB/s")
rates = [f.get("MBps", 0) for f in flows]
if rates and (d.get("slowest_MBps") != min(rates) or
              abs(d.get("mean_MBps", 0) - sum(rates) / len(rates)) > 1e-6):
    problems.append(f"slowest {d.get('slowest_MBps')} / mean {d.get('mean_MBps')} of {rates}")
print("\n".join(problems) if problems else "iperf-ring: both flows, within the link")
sys.exit(1 if problems else 0)
PY

refused() {  # refused WHAT EXPECTED ARGS...: exit 2 and a message with EXPECTED
  local what="$1" expected="$2" rc=0 msg
  shift 2
  msg="$("$RING" "$@" 2>&1)" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, not 2 ($msg)"
  grep -q -- "$expected" <<<"$msg" || fail "$what: no '$expected' in: $msg"
}
refused "no --id" "--id is required" --hosts h0,h1
refused "an unknown host" "no host 'h7'" --id "$ID" --hosts h0,h7
refused "one host" "at least 2 hosts" --id "$ID" --hosts h0
refused "a bad --seconds" "--seconds must be" --id "$ID" --hosts h0,h1 --seconds x
if pgrep -f "iperf3 -s -1 -p 5298" >/dev/null; then fail "an iperf3 server was left running"; fi
echo "iperf-ring: refusals exit 2 with the reason"
