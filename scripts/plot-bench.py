#!/usr/bin/python3
"""Turns the --json output of rdmaflow's benchmarks into PNG plots.

  /usr/bin/python3 scripts/plot-bench.py OUT_PREFIX FILE.json [FILE.json ...]

Which benchmark wrote a file is read from its fields; every file given must
come from the same benchmark and command (repetitions of one run):

  bench/p2p (--json-file)      OUT_PREFIX-latency.png, OUT_PREFIX-bandwidth.png:
                               each transport's curve beside its plain-socket
                               reference (dashed, same colour), gRPC and the
                               link rate where measured
  rdmaflow_coll_bench (--json) OUT_PREFIX-busbw.png: busbw per size of
                               rdmaflow (the selector's algorithm), every forced
                               algorithm (--algo all) and the references (Gloo,
                               MPI); with --codec, OUT_PREFIX-codecs.png: time
                               per call and bytes on the wire per codec against
                               uncompressed at each size
  bench/e2e (--json)           OUT_PREFIX-steps.png: median step time per
                               configuration and transport, and where a
                               comm-heavy step goes on each rank

Repetitions: curves and bars show the median over the files, error bars the
smallest and largest. Needs matplotlib (python3-matplotlib, from
scripts/install-deps.sh). Prints the files it wrote.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench_json import human, load  # noqa: E402

COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def kind_of(doc):
    rows = doc.get("rows")
    if isinstance(rows, list) and any("latency_us" in r or "skipped" in r for r in rows) \
            and "op" not in doc:
        return "p2p"
    if "op" in doc and isinstance(rows, list):
        return "coll"
    if "auto_reason" in doc or "malloc_tunables" in doc:
        return "e2e"
    return None


def spread(values):
    """(median, distance down to the smallest, distance up to the largest)."""
    m = statistics.median(values)
    return m, m - min(values), max(values) - m


def size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes], rotation=45, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("message size (B)")


def curve(ax, points, label, colour, style="-"):
    """points: {size: [value per file]}."""
    sizes = sorted(points)
    med, lo, hi = zip(*(spread(points[s]) for s in sizes))
    ax.errorbar(sizes, med, yerr=[lo, hi], label=label, color=colour, linestyle=style,
                marker="o", markersize=3, capsize=2)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def title_of(docs, what):
    n = len(docs)
    return what + (f" ({n} runs: median, min-max)" if n > 1 else "")


def plot_p2p(docs, prefix):
    for metric, unit, name in (("latency_us", "one-way latency (us)", "latency"),
                               ("bandwidth_MBps", "bandwidth (MB/s)", "bandwidth")):
        fig, ax = plt.subplots(figsize=(8, 5))
        transports = []
        for d in docs:
            for row in d["rows"]:
                if row["transport"] not in transports:
                    transports.append(row["transport"])
        sizes = set()
        for i, t in enumerate(transports):
            mine, ref, mem = {}, {}, {}
            for d in docs:
                for row in d["rows"]:
                    if row["transport"] != t:
                        continue
                    for r in row.get(metric, []):
                        mine.setdefault(r["size"], []).append(r["transport"])
                        ref.setdefault(r["size"], []).append(r["socket"])
                        if r.get("memcpy"):  # the shared-memory rows' second reference
                            mem.setdefault(r["size"], []).append(r["memcpy"])
            if not mine:
                continue
            sizes |= set(mine)
            c = COLOURS[i % len(COLOURS)]
            curve(ax, mine, t, c)
            curve(ax, ref, f"socket reference ({t} row)", c, "--")
            if mem:
                curve(ax, mem, f"memcpy reference ({t} row)", c, ":")
        grpc = {}
        for d in docs:
            for r in d.get("grpc", {}).get(metric, []):
                v = r.get("avg", r.get("MBps"))
                if v:
                    grpc.setdefault(r["size"], []).append(v)
        if grpc:
            curve(ax, grpc, "gRPC RecvTensor", "black", ":")
        links = [d["link_rate"]["best_MBps"] for d in docs if "link_rate" in d]
        if metric == "bandwidth_MBps" and links:
            ax.axhline(statistics.median(links), color="grey", linewidth=1,
                       label=f"link rate (plain TCP, {statistics.median(links):.0f} MB/s)")
        if not sizes:
            plt.close(fig)
            continue
        size_axis(ax, sorted(sizes))
        ax.set_yscale("log")
        ax.set_ylabel(unit)
        hosts = docs[0].get("hosts", [])
        where = "across hosts " + " / ".join(hosts) if docs[0].get("across_hosts") else "one host"
        ax.set_title(title_of(docs, f"bench/p2p {name}, {where}"), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        save(fig, f"{prefix}-{name}.png")


def plot_coll(docs, prefix):
    d0 = docs[0]
    libs = []
    for d in docs:
        for row in d["rows"]:
            for k, v in row.items():
                if isinstance(v, dict) and "busbw_gbs" in v and k not in libs:
                    libs.append(k)
    codecs = [k for k in libs if k.startswith("codec:")]
    refs = [k for k in libs if k in ("gloo", "mpi", "socket")]
    # rdmaflow (the selector's choice) first, then the forced algorithms, then the references.
    plain = [k for k in libs if k == "rdmaflow"] + \
        [k for k in libs if k not in codecs and k not in refs and k != "rdmaflow"] + refs
    what = f"{d0['op']} {d0['type']} {d0['redop']}, {d0['ranks']} ranks on " \
           f"{d0.get('host_count', 1)} host(s), {d0.get('transport_chosen', '')}"
    sizes = sorted({row["size"] for d in docs for row in d["rows"]})
    if codecs and plain == ["rdmaflow"]:  # a codec run: its figure says it all
        plot_codecs(docs, prefix, codecs, sizes, what)
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, lib in enumerate(plain):
        pts = {}
        for d in docs:
            for row in d["rows"]:
                if lib in row and "busbw_gbs" in row[lib]:
                    pts.setdefault(row["size"], []).append(row[lib]["busbw_gbs"])
        if not pts:
            continue
        if lib == "rdmaflow":
            curve(ax, pts, "rdmaflow (the selector's choice)", "black")
        elif lib in refs:
            curve(ax, pts, f"{lib} (reference)", COLOURS[i % len(COLOURS)], "--")
        else:
            curve(ax, pts, f"{lib} (forced)", COLOURS[i % len(COLOURS)], ":")
    size_axis(ax, sizes)
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s, 1e9 B/s)")
    ax.set_title(title_of(docs, "rdmaflow_coll_bench: " + what), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save(fig, f"{prefix}-busbw.png")
    if codecs:
        plot_codecs(docs, prefix, codecs, sizes, what)


def plot_codecs(docs, prefix, codecs, sizes, what):
    names = ["rdmaflow"] + codecs
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.8))
    width = 0.8 / len(sizes)
    for si, size in enumerate(sizes):
        times, errs, wire, base = [], [[], []], [], None
        for name in names:
            vals = [row[name]["time_us"] / 1e3 for d in docs for row in d["rows"]
                    if row["size"] == size and name in row and "time_us" in row[name]]
            m, lo, hi = spread(vals) if vals else (0, 0, 0)
            times.append(m)
            errs[0].append(lo)
            errs[1].append(hi)
            # Measured by rank 0's channel counters where the bench has them
            # (zero on one host: same-host pieces go through memory directly).
            w = [row[name].get("channel_sent_bytes_per_call") or
                 row[name].get("wire_bytes_per_rank", 0) for d in docs for row in d["rows"]
                 if row["size"] == size and name in row]
            wire.append(w[0] / 2**20 if w else 0)
            if name == "rdmaflow":
                base = m
        xs = [i + (si - (len(sizes) - 1) / 2) * width for i in range(len(names))]
        bars = ax_t.bar(xs, times, width, yerr=errs, capsize=2, label=human(size),
                        color=COLOURS[si % len(COLOURS)])
        for b, t in zip(bars, times):
            if base and t:
                ax_t.annotate(f"{base / t:.1f}x", (b.get_x() + b.get_width() / 2, t),
                              ha="center", va="bottom", fontsize=6)
        ax_b.bar(xs, wire, width, label=human(size), color=COLOURS[si % len(COLOURS)])
    labels = ["uncompressed"] + [c[len("codec:"):] for c in codecs]
    for ax in (ax_t, ax_b):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(labels, rotation=30, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, title="buffer", title_fontsize=7)
    ax_t.set_ylabel("time per call, p50 of the slowest rank (ms)")
    ax_t.set_title("time per call (label: speed-up over uncompressed)", fontsize=9)
    ax_b.set_ylabel("MiB one rank sends per call")
    ax_b.set_yscale("log")
    ax_b.set_title("bytes on the wire (rank 0's channels, per call)", fontsize=9)
    fig.suptitle(title_of(docs, "gradient codecs: " + what), fontsize=10)
    save(fig, f"{prefix}-codecs.png")


def plot_e2e(docs, prefix):
    configs = [k for k, v in docs[0].items()
               if isinstance(v, list) and v and isinstance(v[0], dict) and "transport" in v[0]]
    profile = next((d["profile"] for d in docs if "profile" in d), None)
    ncols = 2 if profile else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.8), squeeze=False)
    ax = axes[0][0]
    transports = []
    for cfg in configs:
        for r in docs[0][cfg]:
            if r["transport"] not in transports and "step_ms_median" in r:  # not skipped
                transports.append(r["transport"])
    width = 0.8 / max(1, len(transports))
    for ti, t in enumerate(transports):
        meds, lo, hi = [], [], []
        for cfg in configs:
            vals = [r["step_ms_median"] for d in docs for r in d.get(cfg, [])
                    if r["transport"] == t and "step_ms_median" in r]
            m, a, b = spread(vals) if vals else (0, 0, 0)
            meds.append(m)
            lo.append(a)
            hi.append(b)
        xs = [c + (ti - (len(transports) - 1) / 2) * width for c in range(len(configs))]
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=2, label=t,
               color=COLOURS[ti % len(COLOURS)])
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median step time (ms)")
    ax.set_title(title_of(docs, "bench/e2e step time"), fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    if profile:
        ax = axes[0][1]
        parts = ["compute_ms", "send_ms", "recv_ms", "allreduce_ms", "session_ms"]
        ranks = profile["ranks"]
        bottom = [0.0] * len(ranks)
        for pi, part in enumerate(parts):
            vals = [r["profile"].get(part, 0) for r in ranks]
            if not any(vals):
                continue
            ax.bar(range(len(ranks)), vals, 0.6, bottom=bottom, label=part[:-3],
                   color=COLOURS[pi % len(COLOURS)])
            bottom = [b + v for b, v in zip(bottom, vals)]
        totals = [r["profile"]["total_ms"] for r in ranks]
        ax.plot(range(len(ranks)), totals, "k_", markersize=20, label="step total")
        ax.set_xticks(range(len(ranks)))
        ax.set_xticklabels([f"rank {r['rank']}" for r in ranks], fontsize=8)
        ax.set_ylabel("ms per step (mean after warm-up)")
        ax.set_title(f"where a comm-heavy step goes ({profile.get('transport', '')})",
                     fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, f"{prefix}-steps.png")


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    prefix, paths = argv[1], argv[2:]
    docs = [load(p) for p in paths]
    kinds = {kind_of(d) for d in docs}
    if None in kinds:
        bad = [p for p, d in zip(paths, docs) if kind_of(d) is None]
        print(f"plot-bench: {', '.join(bad)}: not the --json of bench/p2p, "
              "rdmaflow_coll_bench or bench/e2e", file=sys.stderr)
        return 2
    if len(kinds) > 1:
        print(f"plot-bench: the files come from different benchmarks ({', '.join(sorted(kinds))})",
              file=sys.stderr)
        return 2
    {"p2p": plot_p2p, "coll": plot_coll, "e2e": plot_e2e}[kinds.pop()](docs, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
