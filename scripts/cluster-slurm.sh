# shellcheck shell=bash
# Slurm on the simulated hosts, for scripts/cluster (sourced by it; not run alone).
#
# munged and slurmctld run in this machine's own namespaces (slurmctld on the
# bridge address), one slurmd inside each host's namespaces as NodeName=h<K>
# with NodeAddr its address. Everything they read and write lives under
# $DIR/slurm (config, munge key and socket, spool, state, logs, pid files);
# `slurm down` and `down` remove it. srun and the other clients find the
# configuration through SLURM_CONF (`scripts/cluster slurm env`).
#
# What Debian's slurm-wlm needs to run as root without systemd or cgroups:
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
# JobAcctGatherType=jobacct_gather/none, and munge reached through
# AuthInfo=socket=... so a munged of our own (own key, own socket) serves the
# cluster instead of the machine's.

slurm_dir() { echo "$DIR/slurm"; }
slurm_conf() { echo "$DIR/slurm/slurm.conf"; }
# Ports of this cluster's slurmctld (in this machine's namespace, so one per
# cluster id) and of every slurmd (each in its host's namespace).
slurmctld_port() { echo $((16817 + 10 * ID)); }
slurmd_port() { echo 6818; }

# A daemon from its pid file, checked against its command name.
pid_alive() {
  local file="$1" name="$2" pid
  pid="$(cat "$file" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
  echo "$pid"
}

slurm_running() {
  [ -d "$(slurm_dir)" ] && pid_alive "$(slurm_dir)/slurmctld.pid" slurmctld >/dev/null
}

slurm_write_conf() {
  local s
  s="$(slurm_dir)"
  local cpus
  cpus="$(nproc)"
  {
    cat <<EOF
# Written by scripts/cluster --id $ID slurm up; removed by slurm down.
ClusterName=rdmaflow$ID
SlurmctldHost=$(hostname)($SUBNET.1)
SlurmctldPort=$(slurmctld_port)
SlurmdPort=$(slurmd_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$s/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MpiParams=ports=$((20000 + 1000 * ID))-$((20999 + 1000 * ID))
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
StateSaveLocation=$s/ctld
SlurmdSpoolDir=$s/spool-%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$s/plugstack.conf
EOF
    for ((k = 0; k < CONF_HOSTS; k++)); do
      echo "NodeName=h$k NodeAddr=$(host_addr "$k") NodeHostname=h$k CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=cluster Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8"
  } >"$s/slurm.conf"
  : >"$s/plugstack.conf"
}

slurm_start() {
  read_conf || die "cluster $ID is not up: scripts/cluster --id $ID up first"
  local missing=()
  for tool in munged slurmctld slurmd srun sinfo scontrol; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing: ${missing[*]} (Debian: apt-get install slurm-wlm munge; scripts/install-deps.sh)"
  for ((k = 0; k < CONF_HOSTS; k++)); do
    holder_pid "$k" >/dev/null || die "host h$k is not up: scripts/cluster --id $ID up first"
  done
  if slurm_running; then
    log "slurm already up (SLURM_CONF=$(slurm_conf))"
    return 0
  fi
  slurm_stop
  local s
  s="$(slurm_dir)"
  mkdir -p "$s/ctld"
  chmod 711 "$s"
  export SLURM_CONF
  SLURM_CONF="$(slurm_conf)"
  slurm_write_conf

  # munged: a key of our own; munged insists it is private and owned by us.
  if [ ! -f "$s/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom >"$s/munge.key")
  fi
  munged --socket="$s/munge.socket" --key-file="$s/munge.key" --pid-file="$s/munged.pid" \
    --log-file="$s/munged.log" --seed-file="$s/munged.seed" 9>&- ||
    die "munged did not start: $(tail -n 3 "$s/munged.log" 2>/dev/null)"

  # slurmctld, fresh state each time (-c): the node list is this cluster's.
  slurmctld -c -f "$SLURM_CONF" 9>&- ||
    die "slurmctld did not start: $(tail -n 5 "$s/slurmctld.log" 2>/dev/null)"
  for ((k = 0; k < CONF_HOSTS; k++)); do
    mkdir -p "$s/spool-h$k"
    in_host "$k" slurmd -N "h$k" -f "$SLURM_CONF" 9>&- ||
      die "slurmd on h$k did not start: $(tail -n 5 "$s/slurmd-h$k.log" 2>/dev/null)"
  done

  # Up when every node is idle.
  local tries=0 idle
  while :; do
    idle="$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)"
    [ "$idle" -ge "$CONF_HOSTS" ] && break
    tries=$((tries + 1))
    if [ $tries -ge 60 ]; then
      sinfo -N >&2 || true
      die "slurm nodes not idle after 30 s (logs: $s/*.log)"
    fi
    sleep 0.5
  done
  log "slurm up: $CONF_HOSTS nodes (h0..h$((CONF_HOSTS - 1))), partition 'cluster'"
  echo "export SLURM_CONF=$SLURM_CONF"
  [ ! -s "$DIR/job-secret" ] || echo "export RDMAFLOW_JOB_SECRET_FILE=$DIR/job-secret"
}

# Stops slurmd on every host, slurmctld and munged; removes $DIR/slurm.
slurm_stop() {
  local s pid f
  s="$(slurm_dir)"
  [ -d "$s" ] || return 0
  for f in "$s"/slurmd-h*.pid "$s/slurmctld.pid" "$s/munged.pid"; do
    [ -e "$f" ] || continue
    local name
    name="$(basename "$f" .pid)"
    name="${name%%-*}"
    if pid="$(pid_alive "$f" "$name")"; then
      kill "$pid" 2>/dev/null || true
      local tries=0
      while alive "$pid" && [ $tries -lt 50 ]; do
        sleep 0.1
        tries=$((tries + 1))
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  # Job steps left by a killed slurmd: slurmstepd and its tasks, on the hosts.
  local p
  for p in $(pgrep -x slurmstepd || true); do
    local environ
    environ="$(tr '\0' ' ' 2>/dev/null <"/proc/$p/environ" || true)"
    if [[ "$environ" == *"SLURM_CONF=$s/"* ]]; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$s"
}

cmd_slurm() {
  local sub="${1:-}"
  case "$sub" in
    up)
      preflight
      exec 9>"$STATE_ROOT/$ID.lock"
      flock 9
      slurm_start
      ;;
    down)
      preflight
      mkdir -p "$STATE_ROOT"
      exec 9>"$STATE_ROOT/$ID.lock"
      flock 9
      slurm_stop
      log "slurm down"
      ;;
    status)
      if slurm_running; then
        SLURM_CONF="$(slurm_conf)" sinfo -N
      else
        echo "slurm: not up (scripts/cluster --id $ID slurm up)"
        return 1
      fi
      ;;
    env)
      slurm_running || die "slurm is not up (scripts/cluster --id $ID slurm up)"
      echo "export SLURM_CONF=$(slurm_conf)"
      [ ! -s "$DIR/job-secret" ] || echo "export RDMAFLOW_JOB_SECRET_FILE=$DIR/job-secret"
      ;;
    *) die "usage: scripts/cluster slurm up|down|status|env" ;;
  esac
}
