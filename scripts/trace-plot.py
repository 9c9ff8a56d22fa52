#!/usr/bin/python3
"""Draws a merged timeline trace as a Gantt chart (PNG): a band per rank, in it a
row per thread (spans stacked by nesting depth) and a row of channel operations.

Usage: scripts/trace-plot.py MERGED.json -o OUT.png [--from MS] [--to MS] [--title TEXT]

MERGED.json comes from scripts/trace-merge.py (docs/observability.md). --from
and --to cut a window, in milliseconds from the first event. Needs
python3-matplotlib (scripts/install-deps.sh); run with /usr/bin/python3.
"""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as mpatches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"op": "#4c72b0", "session": "#55a868", "collective": "#c44e52", "channel": "#dd8452"}


def lanes(spans):
    """Greedy lanes so that overlapping spans sit on different lines."""
    ends = []
    out = []
    for start, end, e in sorted(spans, key=lambda s: (s[0], -s[1])):
        for i, last in enumerate(ends):
            if last <= start:
                ends[i] = end
                out.append((i, start, end, e))
                break
        else:
            ends.append(end)
            out.append((len(ends) - 1, start, end, e))
    return out, max(1, len(ends))


def depths(spans):
    """Nesting depth of each complete span of one thread."""
    stack = []
    out = []
    for start, end, e in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1] <= start:
            stack.pop()
        out.append((len(stack), start, end, e))
        stack.append(end)
    return out, max([d for d, *_ in out], default=0) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--from", dest="t_from", type=float, default=None, help="ms from the start")
    ap.add_argument("--to", dest="t_to", type=float, default=None, help="ms from the start")
    ap.add_argument("--title", default="rdmaflow timeline")
    args = ap.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    timed = [e for e in events if e.get("ph") in ("X", "b", "e")]
    t0 = min(e["ts"] for e in timed)
    lo = t0 + (args.t_from or 0) * 1000
    hi = t0 + args.t_to * 1000 if args.t_to is not None else float("inf")

    rows = {}  # (pid, row key) -> list of (start, end, event)
    begun = {}
    for e in timed:
        if e["ph"] == "X":
            rows.setdefault((e["pid"], ("thread", e["tid"])), []).append(
                (e["ts"], e["ts"] + e["dur"], e))
        elif e["ph"] == "b":
            begun[(e["pid"], e.get("id"))] = e
        else:
            b = begun.pop((e["pid"], e.get("id")), None)
            if b is not None:
                rows.setdefault((e["pid"], ("channel", 0)), []).append((b["ts"], e["ts"], b))
    for key in rows:
        rows[key] = [(max(s, lo), min(t, hi), e) for s, t, e in rows[key] if t > lo and s < hi]

    y = 0.0
    ticks, labels = [], []
    fig_rows = []
    for key in sorted(rows, key=lambda k: (k[0], k[1][0] == "channel", k[1][1])):
        if not rows[key]:
            continue
        pid, (kind, tid) = key
        placed, n = lanes(rows[key]) if kind == "channel" else depths(rows[key])
        name = procs.get(pid, f"pid {pid}")
        what = "channel ops" if kind == "channel" else threads.get((pid, tid), f"thread {tid}")
        fig_rows.append((y, n, placed))
        ticks.append(y + n / 2)
        labels.append(f"{name} · {what}")
        y += n + 0.6
    fig, ax = plt.subplots(figsize=(14, max(3, 0.32 * y + 1.2)))
    span_ms = (min(hi, max(t for _, _, p in fig_rows for _, _, t, _ in p)) - lo) / 1000
    for base, n, placed in fig_rows:
        for lane, start, end, e in placed:
            x, w = (start - lo) / 1000, max((end - start) / 1000, 0.002)
            ax.broken_barh([(x, w)], (base + lane, 0.9),
                           facecolors=COLORS.get(e.get("cat"), "#8c8c8c"), edgecolors="white",
                           linewidth=0.3)
            if w > 0.06 * span_ms:  # name the spans wide enough to read
                text = e["name"] if len(e["name"]) * 0.006 * span_ms < w else e["name"][:12]
                ax.text(x + w / 2, base + lane + 0.45, text, ha="center", va="center",
                        fontsize=6.5, color="white", clip_on=True)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, rank 0's clock)")
    ax.set_title(args.title)
    ax.legend(handles=[mpatches.Patch(color=c, label=k) for k, c in COLORS.items()],
              loc="upper right", fontsize=8, ncol=4)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"trace-plot: {sum(len(p) for _, _, p in fig_rows)} spans in {len(fig_rows)} rows "
          f"-> {args.output}")


if __name__ == "__main__":
    main()
