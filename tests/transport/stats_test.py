#!/usr/bin/python3
"""RDMAFLOW_STATS in real processes (docs/observability.md, "Counters").

  stats_test.py PROBE BACKEND WORLD     (registered with ctest: stats.<backend>)

1. WORLD ranks of PROBE (tests/transport/stats_probe.cc) move a known number
   of bytes between every pair over BACKEND with
   RDMAFLOW_STATS=1,prometheus:DIR/stats-%r.prom. Each rank's table on stderr
   and its Prometheus file must give, for every peer, what the probe says it
   moved; the files must parse as the text exposition format.
2. Two ranks; rank 1 is SIGKILLed once the mesh is up. Rank 0's table must
   count errors for peer 1, and no other rank's counters may show any.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, failures, free_port  # noqa: E402

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
# The table's columns (common/counters.cc to_table) and the probe's fields.
COLUMNS = {"sent(B)": "bytes_sent", "recv(B)": "bytes_received", "writes": "writes",
           "reads": "reads", "msg_out": "messages_sent", "msg_in": "messages_received",
           "errors": "errors"}
PROM = {"rdmaflow_sent_bytes_total": "bytes_sent",
        "rdmaflow_received_bytes_total": "bytes_received",
        "rdmaflow_errors_total": "errors"}
PROM_OPS = {"write": "writes", "read": "reads", "message_sent": "messages_sent",
            "message_received": "messages_received"}

def run(probe, backend, world, mode, directory):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RDMAFLOW_RANK=str(rank), RDMAFLOW_WORLD_SIZE=str(world),
                   RDMAFLOW_RENDEZVOUS=f"127.0.0.1:{port}",
                   RDMAFLOW_STATS=f"1,prometheus:{directory}/stats-%r.prom")
        if mode == "kill":  # rank 0's store then waits less for the dead rank's goodbye
            env["RDMAFLOW_TIMEOUT_MS"] = "5000"
        procs.append(subprocess.Popen([probe, backend, mode], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        for line in (stdout + stderr).splitlines():
            print(f"[{mode} rank {rank}] {line}")
        out.append((p.returncode, stdout, stderr))
    return out


def parse_table(stderr):
    """{(transport, peer): {field: value}} from the 'rdmaflow stats' table."""
    lines = stderr.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith("rdmaflow stats: rank ")]
    if len(starts) != 1:
        return None
    head = lines[starts[0] + 1].split()
    rows = {}
    for line in lines[starts[0] + 2:]:
        cells = line.split()
        if len(cells) != len(head):
            break
        if cells[0] == "total":
            continue
        row = dict(zip(head, cells))
        rows[(row["transport"], int(row["peer"]))] = {
            field: int(row[col]) for col, field in COLUMNS.items()}
    return rows


def parse_prometheus(text, where):
    """Checks the text exposition format; {(transport, peer): {field: value}}."""
    helps, types, seen = set(), {}, {}
    rows = {}
    for n, line in enumerate(text.splitlines(), 1):
        at = f"{where}:{n}"
        if not line:
            continue
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            check(METRIC_NAME.match(name), f"{at}: bad metric name in HELP: {name}")
            check(name not in helps, f"{at}: second HELP for {name}")
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            check(len(parts) == 4 and parts[3] in ("counter", "gauge", "untyped"),
                  f"{at}: bad TYPE line: {line}")
            check(parts[2] not in types, f"{at}: second TYPE for {parts[2]}")
            types[parts[2]] = parts[3]
            continue
        check(not line.startswith("#"), f"{at}: unexpected comment: {line}")
        m = re.match(r"^([^{ ]+)\{(.*)\} (\S+)$", line)
        check(m is not None, f"{at}: not a sample line: {line}")
        if m is None:
            continue
        name, labels_text, value = m.groups()
        check(METRIC_NAME.match(name), f"{at}: bad metric name {name}")
        check(name in types and name in helps, f"{at}: {name} has no HELP/TYPE before it")
        check(types.get(name) != "counter" or name.endswith("_total"),
              f"{at}: counter {name} does not end in _total")
        labels = dict(LABEL.findall(labels_text))
        check(",".join(f'{k}="{v}"' for k, v in labels.items()) == labels_text,
              f"{at}: malformed labels {labels_text}")
        check({"rank", "peer", "transport"} <= set(labels), f"{at}: missing labels: {line}")
        try:
            v = float(value)
        except ValueError:
            check(False, f"{at}: value {value} is not a number")
            continue
        check(v >= 0, f"{at}: negative counter")
        key = (name, tuple(sorted(labels.items())))
        check(key not in seen, f"{at}: duplicate sample {line}")
        seen[key] = v
        row = rows.setdefault((labels["transport"], int(labels["peer"])), {})
        if name in PROM:
            row[PROM[name]] = int(v)
        elif name == "rdmaflow_operations_total":
            row[PROM_OPS[labels["op"]]] = int(v)
    return rows


def expected_of(stdout):
    exp = {}
    for line in stdout.splitlines():
        if not line.startswith("expect "):
            continue
        fields = dict(kv.split("=") for kv in line.split()[1:])
        key = (fields.pop("transport"), int(fields.pop("peer")))
        exp[key] = {k: int(v) for k, v in fields.items()}
    return exp


def main(probe, backend, world):
    with tempfile.TemporaryDirectory() as d:
        results = run(probe, backend, world, "move", d)
        for rank, (rc, stdout, stderr) in enumerate(results):
            check(rc == 0, f"move: rank {rank} exited {rc}")
            exp = expected_of(stdout)
            check(len(exp) == world - 1, f"move: rank {rank} printed {len(exp)} expectations")
            table = parse_table(stderr)
            check(table is not None, f"move: rank {rank} printed no single stats table")
            prom_path = os.path.join(d, f"stats-{rank}.prom")
            check(os.path.exists(prom_path), f"move: rank {rank} wrote no {prom_path}")
            prom = parse_prometheus(open(prom_path).read(), prom_path) \
                if os.path.exists(prom_path) else {}
            for key, want in exp.items():
                for source, got in (("table", table or {}), ("prometheus", prom)):
                    have = got.get(key)
                    check(have is not None, f"move: rank {rank} {source} has no row {key}")
                    for field, value in want.items():
                        if have is not None:
                            check(have.get(field) == value,
                                  f"move: rank {rank} {source} {key} {field} = "
                                  f"{have.get(field)}, the probe moved {value}")
        if world >= 2:
            results = run(probe, backend, 2, "kill", d)
            rc, stdout, stderr = results[0]
            check(rc == 0, f"kill: rank 0 exited {rc}")
            check(results[1][0] == -9, f"kill: rank 1 ended with {results[1][0]}, not SIGKILL")
            table = parse_table(stderr) or {}
            errors = table.get((backend, 1), {}).get("errors", 0)
            check(errors >= 1, f"kill: rank 0 counted {errors} errors for the killed peer")
            prom = parse_prometheus(open(os.path.join(d, "stats-0.prom")).read(), "kill")
            check(prom.get((backend, 1), {}).get("errors", 0) == errors,
                  "kill: the Prometheus file disagrees with the table on errors")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("stats: every counter matched what moved")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
