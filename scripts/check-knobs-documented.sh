#!/usr/bin/env bash
# Fails when the code reads an RDMAFLOW_* environment variable that has no row
# in the summary table of docs/configuration.md. Registered with ctest as
# docs.knobs_documented (tests/CMakeLists.txt); needs no build.
#
# Usage: scripts/check-knobs-documented.sh [--doc FILE] [SOURCE_ROOT]
#   SOURCE_ROOT  repository root (default: the one holding this script)
#   --doc FILE   page to check against (default: SOURCE_ROOT/docs/configuration.md)
#
# Which variables the code reads. Lookups go through std::getenv and the
# helpers around it (env_string / env_int in common/env.h, and the local
# wrappers env_or, env_mib, bounded, knob), but some names reach a lookup
# through a table (runtime/rendezvous/rank_info.cc's launchers, collective_algo_env() in
# collectives/types.cc). So the script:
#   1. takes every C++ string literal that starts with "RDMAFLOW_ in the source
#      dirs as a variable name (lookups, the tables feeding them, and messages
#      naming a variable), minus NOT_ENV below;
#   2. fails on a literal that is only a prefix ("RDMAFLOW_", "RDMAFLOW_UCX_"):
#      a name assembled at run time cannot be checked;
#   3. fails on an env lookup whose name is not a string literal, unless it is
#      one of KNOWN_INDIRECT below (each lists where its names come from), so a
#      new helper or table is looked at once.
# Macros (RDMAFLOW_LOG_INFO, RDMAFLOW_ARENA_ASAN) and CMake options are not
# string literals and are not considered.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOC=""
while [ $# -gt 0 ]; do
  case "$1" in
    --doc)
      [ $# -ge 2 ] || { echo "knobs: --doc needs a file" >&2; exit 2; }
      DOC="$2"
      shift 2
      ;;
    -h | --help)
      sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      ROOT="$(cd "$1" && pwd)"
      shift
      ;;
  esac
done
DOC="${DOC:-$ROOT/docs/configuration.md}"
DOC_NAME="${DOC#"$ROOT"/}"
SOURCE_DIRS=(common allocator transport graph collectives runtime examples tools bench)

# Quoted "RDMAFLOW_..." literals that are not environment variables. Empty
# today: every such literal names one. Add a name here with the reason.
NOT_ENV=()

# Env lookups with a computed name: "file|call(first-argument". Keep in sync
# with the code; a lookup missing here fails the check.
KNOWN_INDIRECT=(
  # The helpers themselves: their callers pass literals.
  "common/env.cc|getenv(name"             # env_string
  "common/env.cc|env_string(name"         # env_int
  "allocator/arena.cc|env_int(name"          # env_mib
  "transport/tcp/tcp_transport.cc|env_int(name" # env_or
  "transport/tcp/tcp_frame.cc|env_int(name"     # limit_from_env
  "runtime/rendezvous/tcp_store_protocol.cc|env_int(name" # limit_from_env
  "transport/verbs/config.cc|env_string(name" # bounded
  "transport/verbs/config.cc|env_int(name"   # bounded
  # knob(), and oversubscribed()'s OMPI_/MPI_/SLURM_ names (literals in place).
  "collectives/communicator_config.cc|env_int(name"
  # RDMAFLOW_<OP>_ALGO: the literals are in collectives/types.cc.
  "collectives/communicator.cc|env_string(collective_algo_env"
  # kLaunchers: RDMAFLOW_RANK ... and the launchers' variables, literals in place.
  "runtime/rendezvous/rank_info.cc|getenv(name"
  # Saves and restores UCX_TLS / UCX_NET_DEVICES around make_transport.
  "bench/p2p/contender.h|getenv(k.c_str"
  # OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK.
  "bench/p2p/p2p.cc|getenv(v"
)

if [ ! -f "$DOC" ]; then
  echo "knobs: $DOC not found" >&2
  exit 2
fi

cd "$ROOT"
dirs=()
for d in "${SOURCE_DIRS[@]}"; do
  if [ -d "$d" ]; then dirs+=("$d"); fi
done
mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' \
  -o -name '*.hpp' -o -name '*.cxx' -o -name '*.hh' \) | LC_ALL=C sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "knobs: no C++ files under ${SOURCE_DIRS[*]} in $ROOT" >&2
  exit 2
fi

fail=0

# 1. Every literal that starts with RDMAFLOW_: "file:line:NAME".
mapfile -t literals < <(grep -noE '"RDMAFLOW_[A-Z0-9_]*' "${files[@]}" | sed 's/:"/:/')

# 2. Prefixes.
for l in "${literals[@]}"; do
  name="${l##*:}"
  if [[ "$name" == *_ ]]; then
    echo "knobs: ${l%:*}: the literal \"$name\" looks like the prefix of a variable name" \
      "built at run time; spell each name out so it can be checked"
    fail=1
  fi
done

# 3. Env lookups and their first argument: "file:line:call(argument". A call
# whose argument starts on the next line is joined with it.
lookups=$(awk '
  function report(rest) {
    sub(/^[ \t]*/, "", rest)
    printf "%s:%d:%s(%s\n", FILENAME, line, call, rest
  }
  FNR == 1 { pending = 0 }
  {
    if (pending) { report($0); pending = 0 }
    text = $0
    if (text ~ /^[ \t]*(\/\/|\*)/) next          # comment lines
    while (match(text, /(^|[^A-Za-z0-9_])(secure_getenv|getenv|env_string|env_int|env_or|env_mib|bounded|knob)[ \t]*\(/)) {
      hit = substr(text, RSTART, RLENGTH)
      sub(/^[^A-Za-z_]/, "", hit)
      call = hit; sub(/[ \t]*\($/, "", call)
      text = substr(text, RSTART + RLENGTH)
      line = FNR
      if (text ~ /^[ \t]*$/) { pending = 1 } else { report(text) }
    }
  }' "${files[@]}")

declare -A reads=()
while IFS= read -r entry; do
  [ -n "$entry" ] || continue
  file="${entry%%:*}"
  rest="${entry#*:}"
  line="${rest%%:*}"
  call_arg="${rest#*:}"
  call="${call_arg%%(*}"
  arg="${call_arg#*(}"
  if [[ "$arg" =~ ^\"(RDMAFLOW_[A-Z0-9_]+)\" ]]; then
    n="${BASH_REMATCH[1]}"
    reads[$n]="${reads[$n]:-}${reads[$n]:+, }$file:$line"
    continue
  fi
  if [[ "$arg" == \"* ]]; then continue; fi              # a literal, not ours (UCX_TLS)
  if [[ "$arg" =~ ^const[[:space:]] ]]; then continue; fi # declaration / definition
  token=""
  if [[ "$arg" =~ ^([A-Za-z_][A-Za-z0-9_.:]*) ]]; then token="${BASH_REMATCH[1]}"; fi
  key="$file|$call($token"
  known=0
  for k in "${KNOWN_INDIRECT[@]}"; do
    if [ "$k" = "$key" ]; then known=1; break; fi
  done
  if [ $known -eq 0 ]; then
    echo "knobs: $file:$line: $call(${arg%%)*}...) reads a variable whose name is not a literal;" \
      "spell the name(s) out as \"RDMAFLOW_...\" literals and add \"$key\" to KNOWN_INDIRECT" \
      "in scripts/check-knobs-documented.sh"
    fail=1
  fi
done <<< "$lookups"

# Names the code uses, with where each literal is.
declare -A seen=()
for l in "${literals[@]}"; do
  name="${l##*:}"
  [[ "$name" == *_ ]] && continue
  [[ "$name" == RDMAFLOW_ ]] && continue
  skip=0
  for x in "${NOT_ENV[@]+"${NOT_ENV[@]}"}"; do
    if [ "$x" = "$name" ]; then skip=1; break; fi
  done
  [ $skip -eq 1 ] && continue
  seen[$name]="${seen[$name]:-}${seen[$name]:+, }${l%:*}"
done

# The summary table: rows between "## Summary" and the next "## " heading; the
# names in each row's first cell.
declare -A documented=()
while IFS= read -r n; do
  [ -n "$n" ] && documented[$n]=1
done < <(awk '
  /^## / { in_summary = ($0 ~ /^## Summary[ \t]*$/); next }
  in_summary && /^\|/ {
    split($0, cell, "|")
    s = cell[2]
    while (match(s, /RDMAFLOW_[A-Z0-9_]+/)) {
      print substr(s, RSTART, RLENGTH)
      s = substr(s, RSTART + RLENGTH)
    }
  }' "$DOC")

if [ ${#documented[@]} -eq 0 ]; then
  echo "knobs: $DOC_NAME has no \"## Summary\" table listing RDMAFLOW_* variables"
  exit 1
fi

missing=0
for name in $(printf '%s\n' "${!seen[@]}" | LC_ALL=C sort); do
  if [ -z "${documented[$name]:-}" ]; then
    if [ -n "${reads[$name]:-}" ]; then
      where="read at ${reads[$name]}"
    else
      where="named at ${seen[$name]} (a table or message feeding an env lookup)"
    fi
    echo "knobs: $name is not documented: no row in the summary table of $DOC_NAME; $where"
    missing=$((missing + 1))
  fi
done

# Documented but never seen in the code: stale rows (a note, not a failure).
for name in $(printf '%s\n' "${!documented[@]}" | LC_ALL=C sort); do
  if [ -z "${seen[$name]:-}" ]; then
    echo "knobs: note: $name has a row in $DOC_NAME but the code under ${dirs[*]} never names it"
  fi
done

if [ $missing -gt 0 ]; then
  echo "knobs: FAILED: $missing RDMAFLOW_* variable(s) read by the code are missing from" \
    "$DOC_NAME; add a row to its summary table (and describe it in the component's section)"
  fail=1
fi
if [ $fail -ne 0 ]; then exit 1; fi
echo "knobs: all ${#seen[@]} RDMAFLOW_* variables read under ${dirs[*]} have a row in $DOC_NAME"
