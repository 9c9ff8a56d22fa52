#!/usr/bin/env bash
# down leaves nothing: no link, no holder or daemon, no state, no host /tmp.
# shellcheck source=tests/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
require_cluster
"${CLUSTER[@]}" down
links="$(ip -o link show)"
[[ "$links" != *"rfc${ID}"* ]] || fail "links left: $(grep "rfc${ID}" <<<"$links")"
! pgrep -f "^rdmaflow-cluster-$ID-h" >/dev/null || fail "holder processes left"
for f in /proc/[0-9]*/environ; do
  environ="$(tr '\0' ' ' 2>/dev/null <"$f" || true)"
  [[ "$environ" != *"SLURM_CONF=/run/rdmaflow-cluster/$ID/"* ]] ||
    fail "a process of the cluster's Slurm is left: ${f%/environ}"
done
[ ! -e "/run/rdmaflow-cluster/$ID" ] || fail "state left in /run/rdmaflow-cluster/$ID"
[ ! -e "/tmp/rdmaflow-cluster-$ID" ] || fail "host /tmp left in /tmp/rdmaflow-cluster-$ID"
"${CLUSTER[@]}" status >/dev/null && fail "status says up after down"
echo "cluster.down: nothing left"
