#!/usr/bin/python3
"""scripts/network-targets.py on real interleaved sweeps (docs/img/data/selector-sweep-*.json,
the runs of docs/benchmarks.md "Selector against the interleaved sweep").

  network_targets_test.py SOURCE_ROOT     (ctest: tools.network_targets)

The report must give each layout's table with the selector's column and its
own algorithm forced, judge the selector target by the rule the bench prints
(a size where the selector took the fastest algorithm is within), and not
crash on a malformed file (it is left out).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, failures  # noqa: E402

def run(root, d):
    script = os.path.join(root, "scripts", "network-targets.py")
    return subprocess.run(["/usr/bin/python3", script, d], text=True, capture_output=True,
                          timeout=60)


def report(root, data, prefix):
    """network-targets.py's report on the three runs docs/img/data/PREFIX-{4x1,2x2,loopback}.json,
    laid out as cluster-bench writes them."""
    with tempfile.TemporaryDirectory() as d:
        for layout in ("4x1", "2x2", "loopback"):
            shutil.copy(os.path.join(data, f"{prefix}-{layout}.json"),
                        os.path.join(d, f"allreduce-{layout}.json"))
        return run(root, d)


def plain_floor(root, data):
    """Runs with the plain-socket allreduce (docs/img/data/plain-floor-*.json,
    docs/benchmarks.md "A plain-socket floor per size"): a plain column in each
    table, and every short 1.2x row from 64 KiB with what it needs (the best
    reference's time / 1.2) beside what the plain sockets took."""
    r = report(root, data, "plain-floor")
    check(r.returncode == 0, f"plain floor: exit status {r.returncode}: {r.stderr}")
    out = r.stdout
    check("| plain sockets us |" in out, "plain floor: a plain column in the tables")
    for layout, refs, top in (("4x1", ("mpi", "gloo"), 256 << 20),
                              ("2x2", ("mpi", "gloo"), 256 << 20),
                              ("loopback", ("mpi",), 16 << 20)):
        with open(os.path.join(data, f"plain-floor-{layout}.json")) as f:
            rows = json.load(f)["rows"]
        section = out.split(f"allreduce f32, {layout}" if layout != "loopback"
                            else "over loopback TCP")[1].split("###")[0]
        for row in rows:
            size = row["size"]
            best = min(row[x]["time_us"] for x in refs)
            ratio = row["rdmaflow"]["busbw_gbs"] / max(row[x]["busbw_gbs"] for x in refs)
            if not (64 << 10 <= size <= top) or ratio >= 1.2:
                continue
            line = "needs %.1f us; plain sockets took %.1f us (%s)" % (
                best / 1.2, row["plain"]["time_us"], row["plain"]["algo"])
            check(line in section, f"{layout} {size}: the floor line '{line}'")
            if line not in section:
                continue
            took = row["plain"]["time_us"]
            verdict = ("within it" if took <= best / 1.2 else "no floor at this size"
                       if took > best else "beyond what plain TCP did here")
            check(verdict in section.split(line)[1].split("\n")[0],
                  f"{layout} {size}: the verdict '{verdict}'")


def link_bound(root, data):
    """With the link's rate (a p2p-tcp.json beside the runs), a short 1.2x row
    whose need is under the least time any allreduce takes over that link
    (2(H-1)/H of the buffer each way per host) says so with that time; a row
    whose need is above it does not. The rate here is chosen so that the
    bound falls between the needs of two sizes of the real 4 x 1 run."""
    with open(os.path.join(data, "plain-floor-4x1.json")) as f:
        rows = {r["size"]: r for r in json.load(f)["rows"]}
    need = lambda size: min(rows[size][x]["time_us"] for x in ("mpi", "gloo")) / 1.2
    # 1.5 MiB / need(1M) MB/s puts 1 MiB's bound 1.25x its need and 4 MiB's
    # at 4 x 1.5 MiB / that rate: under its need (4 MiB's need is well over
    # 4x 1 MiB's in this run).
    rate = 1.5 * (1 << 20) / (need(1 << 20) * 1.25)
    check(1.5 * (4 << 20) / rate < need(4 << 20), "the chosen rate splits 1 MiB from 4 MiB")
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(data, "plain-floor-4x1.json"),
                    os.path.join(d, "allreduce-4x1.json"))
        with open(os.path.join(d, "p2p-tcp.json"), "w") as f:
            json.dump({"hosts": ["h0", "h1"], "link_rate": {"best_MBps": rate}, "rows": []}, f)
        r = run(root, d)
    check(r.returncode == 0, f"link bound: exit status {r.returncode}: {r.stderr}")
    lines = {l.split(":")[0].strip(" -"): l for l in r.stdout.splitlines() if "needs" in l}
    want = "below the link's bound of %.1f us" % (1.5 * (1 << 20) / rate)
    check(want in lines.get("1M", ""), f"link bound: 1M says '{want}': {lines.get('1M')}")
    check("link's bound" not in lines.get("4M", "x"), f"link bound: not at 4M: {lines.get('4M')}")


def ring_ceiling(root, data):
    """With one rank per host, a short 1.2x row whose busbw target is above
    what plain sockets moved per host in a ring (the run's --socket-ring)
    says so; a row whose target is below it does not, and a layout with
    ranks sharing a host never does. The ceiling is set between the rows'
    needs of the real 4 x 1 run (plain-floor-4x1.json)."""
    with open(os.path.join(data, "plain-floor-4x1.json")) as f:
        run4 = json.load(f)
    need = {}
    for row in run4["rows"]:
        best = max(row[x]["busbw_gbs"] for x in ("mpi", "gloo"))
        if 64 << 10 <= row["size"] and row["rdmaflow"]["busbw_gbs"] < 1.2 * best:
            need[row["size"]] = 1.2 * best * 1000
    ceiling = sorted(need.values())[len(need) // 2]
    check(min(need.values()) < ceiling <= max(need.values()), "the ceiling splits the short rows")
    run4["socket_ring"] = {"MBps": ceiling, "seconds": 1.0}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "allreduce-4x1.json"), "w") as f:
            json.dump(run4, f)
        shutil.copy(os.path.join(data, "plain-floor-2x2.json"),
                    os.path.join(d, "allreduce-2x2.json"))
        r = run(root, d)
    check(r.returncode == 0, f"ring ceiling: exit status {r.returncode}: {r.stderr}")
    section = r.stdout.split("allreduce f32, 4x1")[1].split("###")[0]
    lines = {l.split(":")[0].strip(" -"): l for l in section.splitlines() if "needs" in l}
    for size, bw in need.items():
        human = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
        says = "above the %.0f MB/s plain sockets moved" % ceiling in lines.get(human, "")
        check(says == (bw > ceiling), f"ring ceiling: {human} needs {bw:.0f} MB/s, says {says}")
    other = r.stdout.split("allreduce f32, 2x2")[1].split("###")[0]
    check("plain sockets moved per host" not in other, "ring ceiling: not with ranks sharing a host")


def eight_hosts(root, data):
    """8 x 1 (docs/img/data/targets-8x1.json, docs/benchmarks.md "8 hosts x 1
    against Open MPI and Gloo"): its table comes beside the targets and
    changes no verdict and no count."""
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(data, "selector-sweep-4x1.json"),
                    os.path.join(d, "allreduce-4x1.json"))
        without = run(root, d)
        shutil.copy(os.path.join(data, "targets-8x1.json"), os.path.join(d, "allreduce-8x1.json"))
        with_8 = run(root, d)
    check(with_8.returncode == 0, f"8x1: exit status {with_8.returncode}: {with_8.stderr}")
    check("allreduce f32, 8x1 (not a target" in with_8.stdout, "8x1: its table")
    check("- 8x1, not judged: busbw under 1.2x" in with_8.stdout, "8x1: its comparison line")
    verdicts = lambda out: [l for l in out.splitlines()
                            if l.startswith("- met:") or l.startswith("- SHORT:")
                            or "targets met" in l]
    check(verdicts(with_8.stdout) == verdicts(without.stdout),
          "8x1: the verdicts and the count are those without it")
    check(not any("8x1" in l for l in verdicts(with_8.stdout)), "8x1: judged by no target")


def p2p_latency(root):
    """The p2p 8 B verdict: met at or under 1.1x the socket's p50, short above,
    and it says whether the two were timed interleaved (--interleave) or one
    phase after the other."""
    for p50, interleaved, verdict in ((29.1, True, "met"), (31.0, True, "SHORT"),
                                      (29.1, False, "met")):
        row = {"transport": "tcp", "latency_interleaved": interleaved, "bandwidth_MBps": [],
               "latency_us": [{"size": 8, "transport": 29.0, "socket": 28.0,
                               "transport_p50": p50, "socket_p50": 27.1}]}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "p2p-tcp.json"), "w") as f:
                json.dump({"hosts": ["h0", "h1"], "link_rate": {"best_MBps": 1196},
                           "rows": [row]}, f)
            r = run(root, d)
        check(r.returncode == 0, f"p2p: exit status {r.returncode}: {r.stderr}")
        line = next((l for l in r.stdout.splitlines() if "p2p tcp 8 B" in l), "")
        how = "interleaved" if interleaved else "sequential"
        check(line.startswith(f"- {verdict}: ") and f"; {how})" in line,
              f"p2p 8 B at {p50} us, {how}: {verdict} and says so: {line}")


def loopback_ceiling(root, data):
    """Over loopback with every peer on tcp (plain-floor-loopback.json), the
    --socket-ring rate is read as on 4 x 1: a short row whose busbw target is
    above it says so, per rank; one below it does not."""
    with open(os.path.join(data, "plain-floor-loopback.json")) as f:
        lb = json.load(f)
    need = {}
    for row in lb["rows"]:
        if 64 << 10 <= row["size"] <= 16 << 20 and \
                row["rdmaflow"]["busbw_gbs"] < 1.2 * row["mpi"]["busbw_gbs"]:
            need[row["size"]] = 1.2 * row["mpi"]["busbw_gbs"] * 1000
    check(len(need) >= 2, f"loopback: at least two short rows to split ({need})")
    ceiling = (min(need.values()) + max(need.values())) / 2
    lb["socket_ring"] = {"MBps": ceiling, "seconds": 1.0}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "allreduce-loopback.json"), "w") as f:
            json.dump(lb, f)
        r = run(root, d)
    check(r.returncode == 0, f"loopback ceiling: exit status {r.returncode}: {r.stderr}")
    section = r.stdout.split("over loopback TCP")[1]
    lines = {l.split(":")[0].strip(" -"): l for l in section.splitlines() if "needs" in l}
    for size, bw in need.items():
        human = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
        says = "above the %.0f MB/s plain sockets moved per rank" % ceiling in lines.get(human, "")
        check(says == (bw > ceiling), f"loopback ceiling: {human} needs {bw:.0f} MB/s, says {says}")


def iperf_ring(root, data):
    """An iperf-ring.json over the 4 x 1 run's hosts: the 64 MiB link row of
    4 x 1 quotes its mean per host and busbw's ratio to it; 2 x 2 (two ranks
    a host) does not."""
    flows = [{"host": f"h{i}", "to": f"h{(i + 1) % 4}", "MBps": 800.0 + 100 * i} for i in range(4)]
    with tempfile.TemporaryDirectory() as d:
        for layout in ("4x1", "2x2"):
            shutil.copy(os.path.join(data, f"plain-floor-{layout}.json"),
                        os.path.join(d, f"allreduce-{layout}.json"))
        with open(os.path.join(d, "p2p-tcp.json"), "w") as f:
            json.dump({"hosts": ["h0", "h1"], "link_rate": {"best_MBps": 1200}, "rows": []}, f)
        with open(os.path.join(d, "iperf-ring.json"), "w") as f:
            json.dump({"tool": "iperf3", "hosts": ["h0", "h1", "h2", "h3"], "seconds": 5,
                       "flows": flows}, f)
        r = run(root, d)
    check(r.returncode == 0, f"iperf ring: exit status {r.returncode}: {r.stderr}")
    rows = {l.split(":")[1].strip(): l for l in r.stdout.splitlines() if "64 MiB busbw" in l}
    four, two = rows.get("4x1", ""), rows.get("2x2", "")
    with open(os.path.join(data, "plain-floor-4x1.json")) as f:
        bw = next(x["rdmaflow"]["busbw_gbs"] for x in json.load(f)["rows"]
                  if x["size"] == 64 << 20) * 1000
    want = "moved 950 MB/s per host on average, 0.79 of the link (800-1100); busbw is %.2fx" % (
        bw / 950)
    check(want in four, f"iperf ring: 4x1 says '{want}': {four}")
    check(two and "iperf3" not in two, f"iperf ring: not on 2x2: {two}")


def hier_bound(root, data):
    """The 2 x 2 hier row with the link's rate: where 1.3x the best flat
    algorithm needs less than the least time any allreduce of 16 MiB takes
    between two hosts (16 MiB each way), it says so; with a faster link it
    does not."""
    with open(os.path.join(data, "selector-sweep-2x2.json")) as f:
        row = next(x for x in json.load(f)["rows"] if x["size"] == 16 << 20)
    best = min(v["time_us"] for k, v in row.items()
               if isinstance(v, dict) and "time_us" in v and k not in ("hier", "rdmaflow"))
    least_rate = (16 << 20) / (best / 1.3)  # MB/s at which the bound is the need
    for rate, says in ((least_rate * 0.9, True), (least_rate * 1.1, False)):
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(data, "selector-sweep-2x2.json"),
                        os.path.join(d, "allreduce-2x2.json"))
            with open(os.path.join(d, "p2p-tcp.json"), "w") as f:
                json.dump({"hosts": ["h0", "h1"], "link_rate": {"best_MBps": rate},
                           "rows": []}, f)
            r = run(root, d)
        check(r.returncode == 0, f"hier bound: exit status {r.returncode}: {r.stderr}")
        line = next((l for l in r.stdout.splitlines() if "2x2: hier >= 1.3x" in l), "")
        check(("below the link's bound of %.1f us" % ((16 << 20) / rate) in line) == says,
              f"hier bound at {rate:.0f} MB/s: says {not says}: {line}")


def main(root):
    data = os.path.join(root, "docs", "img", "data")
    with tempfile.TemporaryDirectory() as d:
        for layout, name in (("4x1", "allreduce-4x1"), ("2x2", "allreduce-2x2"),
                             ("loopback", "allreduce-loopback")):
            shutil.copy(os.path.join(data, f"selector-sweep-{layout}.json"),
                        os.path.join(d, f"{name}.json"))
        r = run(root, d)
        check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
        out = r.stdout
        check("interleaved rounds" in out, "says the times are medians of interleaved rounds")
        check("| forced / fastest |" in out, "has the forced column")
        for layout in ("4x1", "2x2"):
            with open(os.path.join(data, f"selector-sweep-{layout}.json")) as f:
                rows = json.load(f)["rows"]
            line = next((l for l in out.splitlines()
                         if l.startswith(f"- SHORT: {layout}: the selector")
                         or l.startswith(f"- met: {layout}: the selector")), "")
            check(line, f"{layout}: a verdict on the selector")
            for row in rows:
                sel = row["selector"]
                off = sel["time_vs_fastest"] > 1.10 and sel["chose"] != sel["fastest"]
                size = row["size"]
                human = next(f"{size >> s}{u}" for s, u in ((30, "G"), (20, "M"), (10, "K"), (0, ""))
                             if size >= 1 << s and size % (1 << s) == 0)
                listed = f" {human} {sel['chose']} " in line.replace("(off at ", " ").replace(";", " ")
                check(listed == off, f"{layout} {human}: listed off {listed}, expected {off}")
        with open(os.path.join(d, "allreduce-2x2.json"), "w") as f:
            f.write("{ not json")
        r = run(root, d)
        check(r.returncode in (0, 2) and "Traceback" not in r.stderr,
              f"a malformed file: exit {r.returncode}, {r.stderr[-200:]}")
    plain_floor(root, data)
    link_bound(root, data)
    ring_ceiling(root, data)
    eight_hosts(root, data)
    p2p_latency(root)
    loopback_ceiling(root, data)
    iperf_ring(root, data)
    hier_bound(root, data)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("network-targets: tables and the selector verdict from real sweeps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
