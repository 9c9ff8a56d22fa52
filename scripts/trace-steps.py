#!/usr/bin/python3
"""Per-step windows of a collective's pieces, from a merged timeline trace.

Usage: scripts/trace-steps.py MERGED.json --bytes N [--algo NAME] [--last K]

MERGED.json comes from scripts/trace-merge.py (docs/observability.md). For the
last K calls (default 1) of N bytes on every rank (and of algorithm NAME, as
the trace's `algorithm` argument spells it), prints one line per algorithm
step, piece kind and peer: when its first piece started and its last ended
(microseconds from the call's start), the summed duration of its pieces
("busy": time inside the executor's piece, including time the rank was
descheduled there), the number of pieces and their bytes. Whether phases
overlap is read off the windows: a step that starts before the previous one
ends runs alongside it.
"""

import argparse
import collections
import json

PIECES = ("send piece", "recv piece", "recv+reduce piece", "copy", "reduce", "scale")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--bytes", type=int, required=True, help="the calls' size (count x element size)")
    ap.add_argument("--algo", help="only calls of this algorithm (e.g. hier, tree)")
    ap.add_argument("--last", type=int, default=1, help="calls per rank, the last ones")
    args = ap.parse_args()

    try:
        with open(args.trace, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"trace-steps: cannot read {args.trace}: {e}")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SystemExit(f"trace-steps: {args.trace} is not a trace-event file (no traceEvents list)")
    calls = collections.defaultdict(list)
    pieces = collections.defaultdict(list)
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") != "collective":
            continue
        a = e.get("args", {})
        if e.get("name") in PIECES:
            pieces[e["pid"]].append(e)
        elif a.get("bytes") == args.bytes and a.get("algorithm") and (
            args.algo is None or a.get("algorithm") == args.algo
        ):
            calls[e["pid"]].append(e)
    if not calls:
        raise SystemExit(f"trace-steps: no call of {args.bytes} bytes in {args.trace}")
    for pid in sorted(calls):
        for c in sorted(calls[pid], key=lambda c: c["ts"])[-args.last :]:
            t0, t1 = c["ts"], c["ts"] + c["dur"]
            steps = {}
            for p in pieces[pid]:
                if not t0 <= p["ts"] <= t1:
                    continue
                a = p.get("args", {})
                key = (a.get("step"), p["name"], a.get("peer"))
                s = steps.setdefault(key, [float("inf"), 0.0, 0.0, 0, 0])
                s[0] = min(s[0], p["ts"] - t0)
                s[1] = max(s[1], p["ts"] + p["dur"] - t0)
                s[2] += p["dur"]
                s[3] += 1
                s[4] += a.get("bytes", 0)
            print(f"rank {pid}: {c['name']} {c['args'].get('algorithm')} {c['dur']:.0f} us")
            for key in sorted(steps, key=lambda k: steps[k][0]):
                first, last, busy, n, b = steps[key]
                step, name, peer = key
                peer_text = "" if peer is None else f" peer {peer}"
                print(
                    f"  step {step} {name}{peer_text}: {first:.0f}..{last:.0f} us, "
                    f"busy {busy:.0f} us, {n} pieces, {b >> 10} KiB"
                )


if __name__ == "__main__":
    main()
