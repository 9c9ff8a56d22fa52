#!/usr/bin/env python3
"""The network-performance targets, judged on one scripts/cluster-bench run.

Reads the JSON of `scripts/cluster-bench --only targets` (the targets/
directory of its output) and prints, per target, the figures it rests on and
whether it is met. Every reference was measured in the same run, on the same
hosts; nothing here is a hard-coded result. Where the run has the plain-socket
allreduce (coll_bench --vs plain), each short 1.2x row and a short 8 B row
say what it needs beside what plain TCP sockets took at that size: a row
plain sockets could not make is beyond what TCP allows on these hosts. With
the link's rate (p2p-tcp.json), a short 1.2x row that needs less than the
least time any allreduce takes over these links says so: no schedule meets it.
The 64 MiB link row quotes the run's iperf3 ring (iperf-ring.json,
scripts/iperf-ring) beside the plain-socket ring.

  scripts/network-targets.py DIR

Exit status 0 when the JSON was read (met or not: this is a report, not a
test), 2 when a file is missing or malformed.
"""
import json
import os
import sys

from bench_json import human, load

MiB = 1 << 20


def verdict(ok):
    return "met" if ok else "SHORT"


class Report:
    def __init__(self):
        self.lines = []
        self.results = []  # (target, met)

    def target(self, name, ok, detail=""):
        self.results.append((name, ok))
        self.lines.append(f"- {verdict(ok)}: {name}{(' (' + detail + ')') if detail else ''}")

    def say(self, line=""):
        self.lines.append(line)


REFERENCES = ("rdmaflow", "mpi", "gloo", "plain", "socket")


def algo_times(row):
    """Every forced algorithm's p50 time in a coll_bench --algo all row."""
    out = {}
    for key, val in row.items():
        if isinstance(val, dict) and "time_us" in val and key not in REFERENCES:
            out[key] = val["time_us"]
    return out


def plain_floor(r, need_us, what, ref_us):
    """The plain-socket allreduce of the row (coll_bench --vs plain) beside the
    time `what` needs: whether plain TCP on these hosts and cores made it. A
    plain time above the reference's own (`ref_us`) is no floor at that size:
    the reference did better than this plain implementation, so the row says
    so instead of calling the target beyond TCP."""
    plain = r.get("plain", {})
    if "time_us" not in plain or not need_us:
        return ""
    took = plain["time_us"]
    if took <= need_us:
        verdict = "within it: TCP allows it here"
    elif took > ref_us:
        verdict = ("%.2fx it, and slower than the reference's own %.1f us: no floor at this "
                   "size" % (took / need_us, ref_us))
    else:
        verdict = "%.2fx it: beyond what plain TCP did here" % (took / need_us)
    return "%s needs %.1f us; plain sockets took %.1f us (%s), %s" % (
        what, need_us, took, plain.get("algo", "?"), verdict)


def link_bound(d, link_MBps):
    """The least time any allreduce of `size` bytes takes between the hosts of
    run `d` over links of `link_MBps` each way: every one of the H hosts
    sends and receives at least 2(H-1)/H of the buffer over its link
    (Patarasuk & Yuan 2009; on 2 hosts, a host learns the other's sum only by
    receiving a buffer of it). None on one host or without the link."""
    hosts = d.get("host_count", 0)
    if hosts < 2 or not link_MBps:
        return None
    return lambda size: 2 * (hosts - 1) / hosts * size / link_MBps  # bytes / (MB/s) = us


def socket_ring_rate(d):
    """What plain TCP sockets moved per rank in a ring in run `d` (coll_bench
    --socket-ring: every rank sending to the next and receiving from the
    previous at once), in MB/s, where every byte an allreduce's busbw counts
    crosses a socket: every rank on a host of its own, or every peer over
    tcp on one host (loopback). A busbw above it is more than those sockets
    and cores moved in that pattern (not a bound: a schedule with one thread
    per rank on its sockets has moved more on 4 x 1). None otherwise (ranks
    sharing a host on the direct path keep part of the traffic off the
    sockets)."""
    hosts, ranks = d.get("host_count", 0), d.get("ranks", 0)
    own_hosts = hosts >= 2 and hosts == ranks
    loopback = (hosts == 1 and ranks >= 2 and d.get("direct_peers", 1) == 0
                and all(isinstance(p, dict) and p.get("medium") == "socket"
                        for p in d.get("rank0_peers", [{}])))
    if not (own_hosts or loopback):
        return None
    return d.get("socket_ring", {}).get("MBps")


def allreduce_table(rep, title, d, refs, top, bound=None):
    """The table of one coll_bench --algo all run: rdmaflow's selector beside
    each reference in `refs` and beside the fastest forced algorithm. Returns
    the rows by size, the sizes from 64 KiB to `top` where rdmaflow's busbw is
    short of 1.2x the best reference, and the sizes where the selector is more
    than 10% slower than the fastest algorithm. `bound` (link_bound) adds the
    link's least time to a short row where the target needs less: no schedule
    reaches it there."""
    names = {"mpi": "Open MPI", "gloo": "Gloo"}
    versus = names[refs[0]] if len(refs) == 1 else f"max({', '.join(names[x] for x in refs)})"
    rows = {r["size"]: r for r in d.get("rows", [])}
    rep.say(title)
    rounds = d.get("rounds", 1)
    if rounds > 1:
        rep.say(f"(every column timed in each of {rounds} interleaved rounds; a time is the "
                "median of its rounds' medians. \"forced\": the selector's algorithm forced, "
                "in its own column, over the fastest: the same schedule twice, so its gap to "
                "\"selector / fastest\" is the run's noise)")
        rep.say()
    has_plain = any("time_us" in r.get("plain", {}) for r in rows.values())
    rep.say("| size | selector | rdmaflow us | busbw GB/s | CPUs busy | "
            + " | ".join(f"{names[x]} us" for x in refs)
            + (" | plain sockets us" if has_plain else "")
            + f" | vs {versus} | fastest algorithm | selector / fastest | forced / fastest |")
    rep.say("|---" * (9 + len(refs) + has_plain) + "|")
    short_bw, short_sel, floors = [], [], []
    for size in sorted(rows):
        r = rows[size]
        ours, sel = r.get("rdmaflow", {}), r.get("selector", {})
        best_ref = max(r.get(x, {}).get("busbw_gbs", 0) for x in refs)
        ratio = ours.get("busbw_gbs", 0) / best_ref if best_ref else None
        algos = algo_times(r)
        forced = (sel["forced_same_us"] / algos[sel["fastest"]]
                  if "forced_same_us" in sel and algos.get(sel.get("fastest")) else None)
        plain = r.get("plain", {})
        rep.say("| %s | %s | %.1f | %.3f | %s | %s%s | %s | %s | %s | %s |" % (
            human(size), ours.get("algo", "?"), ours.get("time_us", 0), ours.get("busbw_gbs", 0),
            "%.0f%%" % (100 * ours["host_cpu_busy"]) if "host_cpu_busy" in ours else "-",
            " | ".join("%.1f" % r[x]["time_us"] if "time_us" in r.get(x, {}) else "-"
                       for x in refs),
            (" | %.1f (%s)" % (plain["time_us"], plain.get("algo", "?")) if "time_us" in plain
             else " | -") if has_plain else "",
            "%.2fx" % ratio if ratio else "-", sel.get("fastest", "-"),
            "%.2fx" % sel["time_vs_fastest"] if "time_vs_fastest" in sel else "-",
            "%.2fx" % forced if forced else "-"))
        if 64 * 1024 <= size <= top and (ratio is None or ratio < 1.2):
            short_bw.append("%s %.2fx" % (human(size), ratio or 0))
            # busbw >= 1.2x the best reference's is time <= its time / 1.2.
            ref_times = [r[x]["time_us"] for x in refs if "time_us" in r.get(x, {})]
            need = min(ref_times) / 1.2 if ref_times else None
            floor = plain_floor(r, need, f"1.2x {versus}", min(ref_times) if ref_times else 0)
            least = bound(size) if bound and need else None
            if least and need < least:
                floor = (floor + "; " if floor else "") + (
                    "below the link's bound of %.1f us (every host sends and receives 2(H-1)/H of "
                    "the buffer): no schedule reaches it" % least)
            ceiling = socket_ring_rate(d)
            need_bw = 1.2 * best_ref * 1000  # MB/s
            if ceiling and need_bw > ceiling:
                floor = (floor + "; " if floor else "") + (
                    "needs busbw %.0f MB/s, above the %.0f MB/s plain sockets moved per %s in a "
                    "ring at once (--socket-ring): beyond what TCP moved on these hosts and cores"
                    % (need_bw, ceiling, "host" if d.get("host_count", 0) > 1 else "rank"))
            if floor:
                floors.append(f"{human(size)}: {floor}")
        # The fastest algorithm chosen is within: the selector's column and the
        # fastest one then time one schedule twice, and their gap is noise.
        if sel.get("time_vs_fastest", 99) > 1.10 and sel.get("chose") != sel.get("fastest"):
            short_sel.append("%s %s %.2fx of %s" % (human(size), sel.get("chose"),
                                                   sel.get("time_vs_fastest", 0),
                                                   sel.get("fastest")))
    rep.say()
    return rows, short_bw, short_sel, floors


def say_floors(rep, floors):
    """Each short 1.2x row beside the plain-socket floor of the same run."""
    for line in floors:
        rep.say(f"  - {line}")


def layout_title(name, d, note=""):
    """A cluster layout's table title: its ranks and hosts and what ran."""
    return (f"### allreduce f32, {name}{note}: {d.get('ranks')} ranks on "
            f"{' '.join(d.get('hosts', []))}, rdmaflow {d.get('transport')}; Open MPI "
            f"{d.get('mpi', {}).get('btl')}; Gloo tcp")


def iperf_ring_line(d, iperf, link_MBps, bw):
    """iperf3 in a ring over the same hosts as run `d` (scripts/iperf-ring,
    iperf-ring.json): what the standard tool moved per host with every host
    sending to the next at once, beside the run's busbw `bw` (MB/s). "" where
    the run is not one rank on each of those hosts."""
    if not isinstance(iperf, dict) or d.get("host_count") != d.get("ranks") or \
            sorted(iperf.get("hosts", [])) != sorted(set(d.get("hosts", []))):
        return ""
    rates = [f.get("MBps") for f in iperf.get("flows", []) if isinstance(f, dict)]
    rates = [r for r in rates if isinstance(r, (int, float)) and r > 0]
    if not rates:
        return ""
    mean = sum(rates) / len(rates)
    return ("; iperf3 in the same ring (every host sending to the next at once, %s s) moved "
            "%.0f MB/s per host on average, %.2f of the link (%.0f-%.0f); busbw is %.2fx that"
            % (iperf.get("seconds", "?"), mean, mean / link_MBps, min(rates), max(rates),
               bw / mean))


def allreduce_layout(rep, name, d, link_MBps, iperf=None):
    rows, short_bw, short_sel, floors = allreduce_table(
        rep, layout_title(name, d), d, ("mpi", "gloo"), 256 * MiB, link_bound(d, link_MBps))
    in_range = [s for s in rows if 64 * 1024 <= s <= 256 * MiB]
    rep.target(f"{name}: busbw >= 1.2x max(Open MPI, Gloo) from 64 KiB to 256 MiB",
               bool(in_range) and not short_bw,
               "short at " + ", ".join(short_bw) if short_bw else f"{len(in_range)} sizes")
    say_floors(rep, floors)
    small = rows.get(8)
    if small and "time_us" in small.get("mpi", {}):
        t, m = small["rdmaflow"]["time_us"], small["mpi"]["time_us"]
        rep.target(f"{name}: 8 B allreduce time <= Open MPI's", t <= m,
                   "%.1f us against %.1f us" % (t, m))
        if t > m and "plain" in small:
            say_floors(rep, [plain_floor(small, m, "matching Open MPI", m)])
    big = rows.get(64 * MiB)
    if big and link_MBps:
        bw = big["rdmaflow"]["busbw_gbs"] * 1000
        ring = d.get("socket_ring", {}).get("MBps")
        socket_ring = ("; plain sockets in a ring (rank r to r+1, all at once) moved %.0f MB/s "
                       "per link, %.2f of the link (1 MiB blocking writes, a sender thread per "
                       "rank); busbw is %.2fx that" % (ring, ring / link_MBps, bw / ring)
                       if ring else "")
        rep.target(f"{name}: 64 MiB busbw >= 0.9 of the link", bw >= 0.9 * link_MBps,
                   "%.0f MB/s = %.2f of %.0f MB/s%s%s" % (
                       bw, bw / link_MBps, link_MBps, socket_ring,
                       iperf_ring_line(d, iperf, link_MBps, bw)))
    rep.target(f"{name}: the selector within 10% of the fastest algorithm at every size",
               bool(rows) and not short_sel,
               "off at " + "; ".join(short_sel) if short_sel else f"{len(rows)} sizes")
    if name == "2x2":
        r = rows.get(16 * MiB)
        times = algo_times(r) if r else {}
        if "hier" in times:
            flat = {k: v for k, v in times.items() if k != "hier"}
            best = min(flat, key=flat.get)
            gain = flat[best] / times["hier"]
            bound = link_bound(d, link_MBps)
            least = bound(16 * MiB) if bound else None
            need = flat[best] / 1.3
            rep.target("2x2: hier >= 1.3x the best flat algorithm at 16 MiB", gain >= 1.3,
                       "hier %.1f us, %s %.1f us: %.2fx%s" % (
                           times["hier"], best, flat[best], gain,
                           "; 1.3x needs %.1f us, below the link's bound of %.1f us (every host "
                           "sends and receives 2(H-1)/H of the buffer): no schedule reaches it"
                           % (need, least) if least and need < least else ""))
    rep.say()


def context_layout(rep, name, d, link_MBps):
    """A layout the issue asks for "if the machine allows" (8 x 1): its table and
    how it compares, judged by no target."""
    title = layout_title(name, d, ' (not a target: "if the machine allows")')
    rows, short_bw, short_sel, floors = allreduce_table(rep, title, d, ("mpi", "gloo"), 256 * MiB,
                                                        link_bound(d, link_MBps))
    rep.say(f"- {name}, not judged: busbw under 1.2x max(Open MPI, Gloo) at "
            + (", ".join(short_bw) if short_bw else "no size from 64 KiB"))
    say_floors(rep, floors)
    rep.say(f"- {name}, not judged: the selector off by more than 10% at "
            + ("; ".join(short_sel) if short_sel else "no size"))
    rep.say()


def loopback(rep, d):
    rows, short, short_sel, floors = allreduce_table(
        rep, "### allreduce f32, 2 ranks over loopback TCP (no namespaces): rdmaflow tcp beside "
        f"Open MPI btl {d.get('mpi', {}).get('btl')}", d, ("mpi",), 16 * MiB)
    rep.target("loopback: busbw >= 1.2x Open MPI btl tcp from 64 KiB to 16 MiB",
               bool(rows) and not short, "short at " + ", ".join(short) if short else "")
    say_floors(rep, floors)
    rep.target("loopback: the selector within 10% of the fastest algorithm at every size",
               bool(rows) and not short_sel, "off at " + "; ".join(short_sel) if short_sel else "")
    rep.say()


def row_of(d, transport):
    for row in d.get("rows", []):
        if row.get("transport") == transport and "skipped" not in row:
            return row
    return None


def p2p(rep, d):
    link = d.get("link_rate", {}).get("best_MBps")
    tcp = row_of(d, "tcp")
    rep.say("### p2p tcp between %s; link %s MB/s (plain TCP sockets, same run)" % (
        " and ".join(d.get("hosts", [])), "%.0f" % link if link else "?"))
    if tcp is None:
        rep.target("p2p tcp ran", False)
        return link
    for r in tcp.get("bandwidth_MBps", []):
        rep.say("- %s: %.0f MB/s, %.2f of the link, %.2fx the socket stream" % (
            human(r["size"]), r["transport"], r.get("ratio_link", 0), r.get("ratio", 0)))
        if r["size"] == 16 * MiB:
            rep.target("p2p tcp 16 MiB >= 0.95 of the link", r.get("ratio_link", 0) >= 0.95,
                       "%.0f MB/s, %.2f" % (r["transport"], r.get("ratio_link", 0)))
    # --interleave: the socket's round trips and the transport's in turn, so
    # both see the same CPU placement and the same warm cores.
    how = "; interleaved" if tcp.get("latency_interleaved") else "; sequential"
    for r in tcp.get("latency_us", []):
        if r["size"] == 8:
            ratio = r["transport_p50"] / r["socket_p50"]
            rep.target("p2p tcp 8 B one-way <= 1.1x the plain socket's (p50)", ratio <= 1.1,
                       "%.1f us against %.1f us: %.2fx (means %.1f / %.1f%s)" % (
                           r["transport_p50"], r["socket_p50"], ratio, r["transport"],
                           r["socket"], how))
    rep.say()
    return link


def load_rows(rep, loaded, quiet, sequential=None):
    rep.say("### 8 B on one host: with --load %s (both cores busy) and quiet" % loaded.get("load"))
    if any(r.get("latency_interleaved") for r in loaded.get("rows", [])):
        rep.say("Loaded: `--interleave`, the socket's round trips and the transport's in turn "
                "in one loop, so both see the same CPU placement; sequential: the socket's "
                "phase, then the transport's (each may find the two ranks on one CPU, about "
                "2 us, or on two, about 20 us: docs/benchmarks.md \"ucx_shm 8 B under load\").")
    rep.say("| transport | loaded p50 us | socket p50 us | ratio | sequential p50 us | its socket p50 us "
            "| quiet p50 us | quiet socket p50 us |")
    rep.say("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for name in ("ucx_shm", "tcp"):
        lr, qr = row_of(loaded, name), row_of(quiet, name) if quiet else None
        sr = row_of(sequential, name) if sequential else None
        if lr is None:
            continue
        lat = size8(lr)
        qlat = size8(qr) if qr else None
        slat = size8(sr) if sr else None
        if lat is None:
            continue
        ratio = lat["transport_p50"] / lat["socket_p50"]
        rep.say("| %s | %.2f | %.2f | %.2fx | %s | %s | %s | %s |" % (
            name, lat["transport_p50"], lat["socket_p50"], ratio,
            cell(slat, "transport_p50"), cell(slat, "socket_p50"),
            cell(qlat, "transport_p50"), cell(qlat, "socket_p50")))
        verdicts.append((name, ratio))
    rep.say()
    for name, ratio in verdicts:
        rep.target(f"same host, {name} 8 B with both cores busy <= 2x the plain socket (p50)",
                   ratio <= 2.0, "%.2fx" % ratio)
    rep.say()


def cell(row, key):
    return "%.2f" % row[key] if row else "-"


def size8(row):
    return next((r for r in row.get("latency_us", []) if r["size"] == 8), None)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    rep = Report()
    rep.say("## Network targets (one run)")
    rep.say()
    link = None
    pt = load(os.path.join(d, "p2p-tcp.json"), missing_ok=True)
    if pt:
        link = p2p(rep, pt)
    iperf = load(os.path.join(d, "iperf-ring.json"), missing_ok=True)
    for name in ("4x1", "2x2"):
        data = load(os.path.join(d, f"allreduce-{name}.json"), missing_ok=True)
        if data:
            allreduce_layout(rep, name, data, link, iperf)
    eight = load(os.path.join(d, "allreduce-8x1.json"), missing_ok=True)
    if eight:
        context_layout(rep, "8x1", eight, link)
    lb = load(os.path.join(d, "allreduce-loopback.json"), missing_ok=True)
    if lb:
        loopback(rep, lb)
    loaded = load(os.path.join(d, "p2p-load.json"), missing_ok=True)
    if loaded:
        load_rows(rep, loaded, load(os.path.join(d, "p2p-quiet.json"), missing_ok=True),
                  load(os.path.join(d, "p2p-load-sequential.json"), missing_ok=True))
    met = sum(1 for _, ok in rep.results if ok)
    rep.say(f"**{met} of {len(rep.results)} targets met.**")
    for line in rep.lines:
        print(line)
    with open(os.path.join(d, "targets.json"), "w") as f:
        json.dump([{"target": t, "met": ok} for t, ok in rep.results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
