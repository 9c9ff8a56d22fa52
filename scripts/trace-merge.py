#!/usr/bin/python3
"""Merges the per-rank timeline traces of a job into one Chrome trace-event file.

Usage: scripts/trace-merge.py [-o OUT] DIR_OR_FILE...

Every rank of a job run with RDMAFLOW_TRACE=DIR wrote
DIR/rdmaflow-trace-rank<R>-pid<P>.json (docs/observability.md). This tool
reads those files (a directory stands for every rdmaflow-trace-*.json in it,
except an earlier merge) and writes one file where each rank is one process
(pid = rank, named "rank R", sorted by rank) with its threads, ready for
ui.perfetto.dev or chrome://tracing. A process that never learned its rank (a
single-process run) keeps its OS pid and is named "pid P".

Clocks: each rank wrote its timestamps already shifted into rank 0's clock
(the offset measured at bootstrap, recorded as otherData.clock_offset_ns); the
merge keeps them. Async operation ids are made unique across files.

Standard library only; run with /usr/bin/python3.
"""

import argparse
import json
import os
import sys

MERGED_NAME = "rdmaflow-trace-merged.json"


def input_files(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            names = sorted(n for n in os.listdir(p)
                           if n.startswith("rdmaflow-trace-") and n.endswith(".json")
                           and n != MERGED_NAME)
            if not names:
                raise SystemExit(f"trace-merge: no rdmaflow-trace-*.json in {p}")
            files += [os.path.join(p, n) for n in names]
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise SystemExit(f"trace-merge: {p}: no such file or directory")
    return files


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"trace-merge: {path}: not a readable trace: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SystemExit(f"trace-merge: {path}: no traceEvents list (not a Chrome trace file)")
    return doc


def merge(files):
    events = []
    ranks = {}
    for index, path in enumerate(files):
        doc = load(path)
        meta = doc.get("otherData", {})
        rank = meta.get("rank", -1)
        pid = rank if isinstance(rank, int) and rank >= 0 else int(meta.get("os_pid", 100000 + index))
        name = f"rank {rank}" if pid == rank else f"pid {pid}"
        info = ranks.setdefault(pid, {"name": name, "files": [], "events_dropped": 0,
                                      "clock_offset_ns": [], "clock_rtt_ns": []})
        info["files"].append(os.path.basename(path))
        info["events_dropped"] += int(meta.get("events_dropped", 0))
        info["clock_offset_ns"].append(meta.get("clock_offset_ns", 0))
        info["clock_rtt_ns"].append(meta.get("clock_rtt_ns", -1))
        for e in doc["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index"):
                continue  # written once per process below
            e = dict(e)
            e["pid"] = pid
            if "id" in e:
                e["id"] = f"{index}:{e['id']}"
            events.append(e)
    head = []
    for pid, info in sorted(ranks.items()):
        head.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": info["name"]}})
        head.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    meta = {str(pid): info for pid, info in sorted(ranks.items())}
    return {"displayTimeUnit": "ns", "otherData": {"merged_from": meta},
            "traceEvents": head + events}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="trace directories or files")
    ap.add_argument("-o", "--output",
                    help=f"merged file (default: {MERGED_NAME} in the first directory given, "
                         "else standard output)")
    args = ap.parse_args()
    out = args.output
    if out is None and os.path.isdir(args.paths[0]):
        out = os.path.join(args.paths[0], MERGED_NAME)
    merged = merge(input_files(args.paths))
    text = json.dumps(merged, separators=(",", ":"))
    if out is None or out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        procs = sorted(merged["otherData"]["merged_from"])
        print(f"trace-merge: {len(merged['traceEvents'])} events of {len(procs)} processes "
              f"-> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
