#!/usr/bin/python3
"""The timeline trace (RDMAFLOW_TRACE, docs/observability.md) on real jobs.

Usage: trace_test.py CASE --build BUILD_DIR --source SOURCE_DIR [--mpirun PATH]

Cases (one ctest entry each, tests/tools/CMakeLists.txt):
  collectives  4 ranks of rdmaflow_coll_bench under mpirun over tcp: one file
               per rank, each a valid trace-event file with the collective,
               program, piece and channel spans; merged into one file with 4
               processes; scripts/trace-steps.py reads the merged file.
  demo         the demo (4 ranks, parameter-server training over tcp): Session
               steps, sends, recvs, the executor's ops and channel writes;
               merged.
  ring         RDMAFLOW_TRACE_EVENTS=64: every file reports dropped events and
               holds at most 64, and stays small.
  bad_dir      RDMAFLOW_TRACE under a regular file: the job runs, a warning
               names the path, no file appears.
Exit 77 (ctest's skip) when a tool the case needs is not built.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
TOLERANCE_US = 0.002  # ts and dur are printed to the nanosecond, each rounded


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, env_extra, timeout=240):
    env = dict(os.environ)
    env.update(env_extra)
    print("$ " + " ".join(f"{k}={v}" for k, v in env_extra.items()) + " " + " ".join(cmd))
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        print(p.stdout)
        fail(f"{cmd[0]} exited with {p.returncode}")
    return p.stdout


def validate(path):
    """Checks one file against the trace-event format; returns (doc, events without M)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as e:
        fail(f"{path}: not valid JSON: {e}")
    check(isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list),
          f"{path}: no traceEvents list")
    events = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    opened = {}
    last_ts = {}
    stacks = {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        check(ph in ("X", "b", "e", "M"), f"{path}: unexpected phase {ph!r} in {e}")
        check(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int),
              f"{path}: pid/tid not integers in {e}")
        check(isinstance(e.get("name"), str) and e["name"], f"{path}: event without a name: {e}")
        if ph == "M":
            continue
        check(isinstance(e.get("ts"), (int, float)), f"{path}: ts missing in {e}")
        thread = (e["pid"], e["tid"])
        if ph == "X":
            check(e.get("dur", -1) >= 0, f"{path}: X event with dur < 0 or none: {e}")
            # Monotonic per thread, and properly nested: a span that starts
            # inside another ends inside it.
            check(e["ts"] >= last_ts.get(thread, float("-inf")),
                  f"{path}: timestamps go back on thread {thread} at {e}")
            last_ts[thread] = e["ts"]
            stack = stacks.setdefault(thread, [])
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + TOLERANCE_US:
                stack.pop()
            if stack:
                check(end <= stack[-1] + TOLERANCE_US,
                      f"{path}: {e} overlaps its enclosing span on thread {thread}")
            stack.append(end)
        else:
            key = (e["pid"], e.get("cat"), e.get("id"))
            check(e.get("id") is not None, f"{path}: async event without id: {e}")
            if ph == "b":
                check(key not in opened, f"{path}: async id {key} begun twice")
                opened[key] = e
            else:
                check(key in opened, f"{path}: 'e' without its 'b': {e}")
                b = opened.pop(key)
                check(b["name"] == e["name"], f"{path}: b/e names differ: {b} {e}")
                check(e["ts"] >= b["ts"], f"{path}: async span ends before it begins: {e}")
    check(not opened, f"{path}: {len(opened)} 'b' events without their 'e'")
    return doc, events


def rank_files(trace_dir, world):
    files = sorted(glob.glob(os.path.join(trace_dir, "rdmaflow-trace-rank*.json")))
    ranks = []
    for f in files:
        doc, _ = validate(f)
        ranks.append(doc["otherData"]["rank"])
    check(sorted(ranks) == list(range(world)),
          f"expected one file per rank 0..{world - 1} in {trace_dir}, found ranks {ranks}")
    return files


def names_of(events, cat=None):
    return {e["name"] for e in events if cat is None or e.get("cat") == cat}


def expect_names(path, events, wanted):
    have = names_of(events)
    missing = [n for n in wanted if n not in have]
    check(not missing, f"{path}: spans {missing} missing (have {sorted(have)[:40]})")


def merge_and_check(args, trace_dir, world):
    out = os.path.join(trace_dir, "merged.json")
    run(["/usr/bin/python3", os.path.join(args.source, "scripts", "trace-merge.py"), "-o", out]
        + sorted(glob.glob(os.path.join(trace_dir, "rdmaflow-trace-rank*.json"))), {})
    doc, events = validate(out)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    check(names == {r: f"rank {r}" for r in range(world)},
          f"merged: processes {names}, expected ranks 0..{world - 1}")
    for r in range(world):
        check(any(e["pid"] == r for e in events), f"merged: no events of rank {r}")
    # The clocks were aligned: every rank's spans overlap rank 0's time range.
    lo = {r: min(e["ts"] for e in events if e["pid"] == r) for r in range(world)}
    hi = {r: max(e["ts"] for e in events if e["pid"] == r) for r in range(world)}
    for r in range(1, world):
        check(lo[r] < hi[0] and hi[r] > lo[0],
              f"merged: rank {r}'s events [{lo[r]}, {hi[r]}] miss rank 0's [{lo[0]}, {hi[0]}]")
    print(f"merged: {len(events)} events of {world} ranks")


def coll_bench_cmd(args, world, extra):
    mpirun = args.mpirun
    exe = os.path.join(args.build, "bench", "collectives", "rdmaflow_coll_bench")
    if not mpirun or not os.path.exists(exe):
        print(f"SKIP: needs mpirun ({mpirun or 'not found'}) and {exe}")
        sys.exit(SKIP)
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(world)] + \
        [a for k in extra for a in ("-x", k)] + \
        [exe, "--transport", "tcp", "--sizes", "64K,1M", "-n", "2", "-w", "1"]


def demo_cmd(args, ranks, steps):
    exe = os.path.join(args.build, "bench", "e2e", "rdmaflow-demo")
    if not os.path.exists(exe):
        print(f"SKIP: needs {exe}")
        sys.exit(SKIP)
    return [exe, "--transports", "tcp", "--ranks", str(ranks), "--steps", str(steps),
            "--widths", "64,32,10"]


def case_collectives(args, tmp):
    trace_dir = os.path.join(tmp, "coll")
    env = {"RDMAFLOW_TRACE": trace_dir}
    run(coll_bench_cmd(args, 4, env), env)
    for f in rank_files(trace_dir, 4):
        _, events = validate(f)
        expect_names(f, events, ["allreduce", "program", "send piece", "write"])
        check(any(n.startswith("recv") for n in names_of(events)), f"{f}: no recv piece span")
        calls = [e for e in events if e["name"] == "allreduce"]
        check(all(e["args"].get("algorithm") and e["args"].get("bytes", 0) > 0
                  and e["args"].get("peers") == 4 for e in calls),
              f"{f}: an allreduce span lacks algorithm, bytes or peers: {calls[:2]}")
        writes = [e for e in events if e["name"] == "write" and e["ph"] == "b"]
        check(all(e["args"].get("transport") == "tcp" and e["args"].get("peer", -1) >= 0
                  and e["args"].get("bytes", -1) >= 0 for e in writes),
              f"{f}: a write span lacks transport, peer or bytes: {writes[:2]}")
    merge_and_check(args, trace_dir, 4)
    steps_of_merged(args, os.path.join(trace_dir, "merged.json"))


def steps_of_merged(args, merged):
    """scripts/trace-steps.py on the merged file: every rank's last 64 KiB call
    and its steps; a missing or malformed file is refused in one line."""
    tool = ["/usr/bin/python3", os.path.join(args.source, "scripts", "trace-steps.py")]
    out = run(tool + [merged, "--bytes", str(64 * 1024)], {})
    for r in range(4):
        check(f"rank {r}: allreduce" in out, f"trace-steps: no call of rank {r} in:\n{out}")
    check(" step " in out and " pieces, " in out, f"trace-steps: no step lines in:\n{out}")
    bad = os.path.join(os.path.dirname(merged), "bad.json")
    with open(bad, "w", encoding="utf-8") as f:
        f.write("{not json")
    for path in (bad, os.path.join(os.path.dirname(merged), "absent.json")):
        p = subprocess.run(tool + [path, "--bytes", "8"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        check(p.returncode != 0 and "trace-steps: cannot read" in p.stdout
              and "Traceback" not in p.stdout, f"trace-steps on {path}: {p.stdout}")


def case_demo(args, tmp):
    trace_dir = os.path.join(tmp, "demo")
    env = {"RDMAFLOW_TRACE": trace_dir}
    run(demo_cmd(args, 4, 3), env)
    for f in rank_files(trace_dir, 4):
        _, events = validate(f)
        expect_names(f, events, ["step", "send", "recv", "executor step", "write"])
        ops = names_of(events, "op")
        check(len(ops) > 3, f"{f}: only {sorted(ops)} executor op spans")
        steps = sorted(e["args"]["step"] for e in events if e["name"] == "step")
        check(steps == [0, 1, 2], f"{f}: Session step spans {steps}, expected 0, 1, 2")
    merge_and_check(args, trace_dir, 4)


def case_ring(args, tmp):
    trace_dir = os.path.join(tmp, "ring")
    cap = 64
    env = {"RDMAFLOW_TRACE": trace_dir, "RDMAFLOW_TRACE_EVENTS": str(cap)}
    run(coll_bench_cmd(args, 4, env), env)
    for f in rank_files(trace_dir, 4):
        doc, events = validate(f)
        meta = doc["otherData"]
        spans = sum(1 for e in events if e["ph"] in ("X", "b"))
        check(meta["buffer_events"] == cap, f"{f}: buffer_events {meta['buffer_events']} != {cap}")
        check(spans <= cap, f"{f}: {spans} spans kept in a buffer of {cap}")
        check(meta["events_dropped"] > 0 and
              meta["events_dropped"] == meta["events_recorded"] - spans,
              f"{f}: dropped {meta['events_dropped']} of {meta['events_recorded']} "
              f"with {spans} kept")
        size = os.path.getsize(f)
        check(size < cap * 600 + 8192, f"{f}: {size} bytes for {cap} events")
        print(f"{os.path.basename(f)}: kept {spans}, dropped {meta['events_dropped']}, "
              f"{size} bytes")


def case_bad_dir(args, tmp):
    blocker = os.path.join(tmp, "a-file")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    bad = os.path.join(blocker, "trace")
    out = run(demo_cmd(args, 2, 1), {"RDMAFLOW_TRACE": bad, "RDMAFLOW_TRACE_EVENTS": "lots"})
    check(f"RDMAFLOW_TRACE={bad}" in out and "tracing is off" in out,
          f"no warning naming RDMAFLOW_TRACE={bad}:\n{out}")
    check("RDMAFLOW_TRACE_EVENTS='lots'" in out, f"no warning about RDMAFLOW_TRACE_EVENTS:\n{out}")
    check(not os.path.exists(bad), f"{bad} exists")
    print("bad RDMAFLOW_TRACE: warned, job ran")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["collectives", "demo", "ring", "bad_dir"])
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--mpirun", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdmaflow-trace-test-") as tmp:
        globals()["case_" + args.case](args, tmp)
    print("PASS")


if __name__ == "__main__":
    main()
