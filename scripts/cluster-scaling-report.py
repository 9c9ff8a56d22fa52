#!/usr/bin/env python3
"""The scaling model's report from a `scripts/cluster-bench --only scaling` run.

Reads DIR (the run's scaling/ directory), asks rdmaflow_cost_model what the
collectives' cost model predicts, and prints markdown (docs/scaling.md):
  1. the costs of each level, as rdmaflow's communicators measured them
     (median of three) and the link as the p2p benchmark measured it;
  2. the per-link costs with every host of a layout busy, fitted to a ring
     allgather on that layout (8 B and 16 MiB);
  3. per layout and algorithm: measured allreduce time beside the model's
     prediction from the two-host costs and from the busy-link costs;
  4. the projection to 1024 ranks (128 hosts x 8) on 25 and 100 Gbit links.

  scripts/cluster-scaling-report.py DIR --model BUILD/bench/collectives/rdmaflow_cost_model
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

from bench_json import human, load

TOLERANCE = 0.25  # the model is "within" when |measured / predicted - 1| <= this
PROJECTION_SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20]
NAMES = {"flat ring": "ring", "flat rabenseifner": "rabenseifner"}


def us(seconds):
    return "%.1f" % (seconds * 1e6) if seconds >= 0 else "-"


class Model:
    def __init__(self, exe):
        self.exe = exe

    def predict(self, hosts, alpha, beta, gamma, sizes, per_host=1, intra=None, op="allreduce"):
        """{(size, schedule): seconds} of rdmaflow_cost_model."""
        cmd = [self.exe, "--json", "--op", op, "--hosts", str(hosts), "--per-host", str(per_host),
               "--alpha", repr(alpha), "--beta", repr(beta), "--gamma", repr(gamma),
               "--sizes", ",".join(str(s) for s in sizes)]
        if intra:
            cmd += ["--intra-alpha", repr(intra[0]), "--intra-beta", repr(intra[1])]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        return {(r["size"], NAMES.get(r["schedule"], r["schedule"])): r for r in out["rows"]}


def median_params(paths):
    params = [load(p)["cost_params"] for p in paths]
    return {k: statistics.median(p[k] for p in params) for k in params[0]}, params


def measured_times(doc):
    return {r["size"]: r["rdmaflow"]["time_us"] * 1e-6 for r in doc["rows"]}


def fit_busy(model, n, times):
    """alpha, beta of a ring allgather over n ranks that reproduce its measured
    times at the smallest and largest size (the model is linear in both)."""
    small, large = min(times), max(times)
    ca = model.predict(n, 1.0, 0.0, 0.0, [small, large], op="allgather")
    cb = model.predict(n, 0.0, 1.0, 0.0, [small, large], op="allgather")
    a11, a12 = ca[(small, "ring")]["seconds"], cb[(small, "ring")]["seconds"]
    a21, a22 = ca[(large, "ring")]["seconds"], cb[(large, "ring")]["seconds"]
    det = a11 * a22 - a12 * a21
    alpha = (times[small] * a22 - a12 * times[large]) / det
    beta = (a11 * times[large] - a21 * times[small]) / det
    return max(alpha, 0.0), max(beta, 1e-12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--model", required=True, help="the rdmaflow_cost_model executable")
    args = ap.parse_args()
    model = Model(args.model)
    d = args.dir
    out = []
    p = out.append

    inter, inter_all = median_params(sorted(glob.glob(os.path.join(d, "level-inter-*.json"))))
    intra, intra_all = median_params(sorted(glob.glob(os.path.join(d, "level-intra-*.json"))))
    gamma = statistics.median([x["gamma_s_per_byte"] for x in inter_all + intra_all])
    p2p = load(os.path.join(d, "p2p-tcp.json"))
    link = (p2p.get("link_rate") or {}).get("best_MBps")
    tcp_rows = [r for r in p2p.get("rows", []) if r.get("transport") == "tcp"]
    if not tcp_rows or not tcp_rows[0].get("bandwidth_MBps"):
        sys.exit("cluster-scaling-report: no tcp bandwidth in p2p-tcp.json")
    tcp_bw = max(r["transport"] for r in tcp_rows[0]["bandwidth_MBps"])
    tcp_lat = tcp_rows[0]["latency_us"][0] if tcp_rows[0].get("latency_us") else None
    # Between hosts: alpha from the communicators' 8 B ping-pong, beta from the
    # streamed bandwidth (a 256 KiB ping-pong fits in the link's tbf bucket and
    # in the socket buffers, so it overstates the link).
    a_e, b_e = inter["alpha_s"], 1e-6 / tcp_bw
    a_i, b_i = intra["alpha_s"], intra["beta_s_per_byte"]

    p("### Costs of each level (two ranks, the rest of the cluster idle)\n")
    p("| level | alpha (us per message) | beta (ns per byte) | as bandwidth | gamma (ns per byte) |")
    p("|---|---|---|---|---|")
    p("| within a host (shared memory, direct path) | %.2f | %.3f | %.2f GB/s | %.3f |"
      % (a_i * 1e6, b_i * 1e9, 1e-9 / b_i, gamma * 1e9))
    p("| between hosts (tcp over the simulated link) | %.2f | %.3f | %.2f GB/s | %.3f |"
      % (a_e * 1e6, b_e * 1e9, 1e-9 / b_e, gamma * 1e9))
    p("")
    p("alpha and gamma: medians of three communicators per level, as each measures them when it "
      "is created (a ping-pong of 8 B through the collectives' own channels; the f32 sum kernel "
      "timed). The three between hosts: alpha %s us. Within a host beta is the communicators' "
      "256 KiB ping-pong (%s ns/B). Between hosts beta is the rdmaflow tcp stream of the p2p "
      "benchmark in this run, %.0f MB/s at its best size (plain TCP stream: %s MB/s): the "
      "communicators' 256 KiB ping-pong said %s ns/B, %.1fx the link, because a message that "
      "size fits in the link's token bucket (1 ms of its rate) and in the socket buffers."
      % (", ".join("%.1f" % (x["alpha_s"] * 1e6) for x in inter_all),
         ", ".join("%.3f" % (x["beta_s_per_byte"] * 1e9) for x in intra_all), tcp_bw,
         "%.0f" % link if link else "?",
         ", ".join("%.3f" % (x["beta_s_per_byte"] * 1e9) for x in inter_all),
         b_e / inter["beta_s_per_byte"]))
    if tcp_lat:
        p("The p2p benchmark's 8 B one-way latency in this run: rdmaflow tcp %.1f us, plain "
          "socket %.1f us." % (tcp_lat["transport"], tcp_lat["socket"]))
    p("")

    layouts = []
    for name in sorted({os.path.basename(x).split("-")[0]
                        for x in glob.glob(os.path.join(d, "*x*-allreduce-*.json"))}):
        hosts, q = (int(x) for x in name.split("x"))
        path = os.path.join(d, f"{name}-allgather-ring.json")
        layouts.append((hosts, q, name, path if os.path.exists(path) else None))
    layouts.sort(key=lambda x: (x[1], x[0]))

    p("### Per-link costs with every host of the layout busy\n")
    p("All the simulated hosts share this machine's cores, so the more hosts send at once the "
      "less each link carries. Fitted per layout to a ring allgather (8 B and 16 MiB) on it; "
      "the layouts of 2 ranks per host use the figures of the layout with as many ranks:\n")
    p("| layout | ranks | alpha (us) | beta (ns/B) | per link |")
    p("|---|---|---|---|---|")
    busy = {}
    for hosts, q, name, path in layouts:
        if path is None:
            continue
        n = hosts * q
        alpha, beta = fit_busy(model, n, measured_times(load(path)))
        busy[name] = (alpha, beta)
        p("| %d hosts x %d | %d | %.1f | %.3f | %.2f GB/s |"
          % (hosts, q, n, alpha * 1e6, beta * 1e9, 1e-9 / beta))
    p("")

    within = total = 0
    misses = []
    p("### Allreduce: measured against the model\n")
    p("Measured: p50 of the slowest rank (rdmaflow_coll_bench). Model: the library's cost model "
      "(one rank per host), or the two-level schedules of rdmaflow_cost_model (two ranks per host), "
      "with the two-host costs above (idle) and with the layout's busy-link costs (busy). "
      "ratio = measured / busy model.\n")
    for hosts, q, name, _ in layouts:
        runs = sorted(glob.glob(os.path.join(d, f"{name}-allreduce-*.json")))
        if not runs:
            continue
        docs = {os.path.basename(r)[len(name) + len("-allreduce-"):-5]: load(r) for r in runs}
        sizes = sorted({s for doc in docs.values() for s in measured_times(doc)})
        intra_costs = (a_i, b_i) if q > 1 else None
        idle = model.predict(hosts, a_e, b_e, gamma, sizes, q, intra_costs)
        ba, bb = busy.get(name) or busy.get("%dx1" % (hosts * q)) or (a_e, b_e)
        loaded = model.predict(hosts, ba, bb, gamma, sizes, q, intra_costs)
        p("%d hosts x %d rank%s:\n" % (hosts, q, "s" if q > 1 else ""))
        p("| size | algorithm | measured (us) | model idle (us) | model busy (us) | ratio |")
        p("|---|---|---|---|---|---|")
        for size in sizes:
            for algo, doc in docs.items():
                t = measured_times(doc).get(size)
                if t is None or (size, algo) not in loaded:
                    continue
                pred = loaded[(size, algo)]["seconds"]
                ratio = t / pred if pred > 0 else float("inf")
                total += 1
                ok = abs(ratio - 1) <= TOLERANCE
                within += ok
                if not ok:
                    misses.append((name, human(size), algo, ratio))
                p("| %s | %s | %s | %s | %s | %.2f%s |"
                  % (human(size), algo, us(t), us(idle[(size, algo)]["seconds"]), us(pred), ratio,
                     "" if ok else " *"))
        p("")
    p("Within %d%% of the busy model: %d of %d (* marks the others)." % (TOLERANCE * 100, within,
                                                                       total))
    p("")

    p("### Projection: 1024 ranks, 128 hosts x 8\n")
    eta = (tcp_bw / 1250.0) if tcp_bw else 1.0  # of the 10 Gbit/s tbf rate
    p("Assumptions: between hosts alpha = %.1f us (the two-host figure above: tcp through "
      "rdmaflow's channels) and beta = 1 / (link rate x %.2f), the fraction of the 10 Gbit/s "
      "link rdmaflow's tcp reached at 16 MiB in this run; within a host alpha = %.2f us, beta = "
      "%.3f ns/B and gamma = %.3f ns/B as measured here, and the 8 ranks of a host do not slow "
      "each other's memory. Every host has cores of its own (unlike the cluster in a box). "
      "bound = 2(H-1)/H x size / link, what each host must send at least; efficiency = bound / "
      "time; busbw in the nccl-tests convention over all 1024 ranks.\n"
      % (a_e * 1e6, eta, a_i * 1e6, b_i * 1e9, gamma * 1e9))
    for gbit in (25, 100):
        beta = 8.0 / (gbit * 1e9 * eta)
        pred = model.predict(128, a_e, beta, gamma, PROJECTION_SIZES, 8, (a_i, b_i))
        small = model.predict(2, a_e, beta, gamma, PROJECTION_SIZES, 8, (a_i, b_i))
        p("%d Gbit/s links:\n" % gbit)
        p("| size | schedule | time (ms) | busbw (GB/s) | efficiency | time vs 2 hosts x 8 |")
        p("|---|---|---|---|---|---|")
        for (size, sched), r in sorted(pred.items(), key=lambda kv: (kv[0][0], kv[1]["seconds"])):
            p("| %s | %s | %.2f | %.2f | %.0f%% | %.2fx |"
              % (human(size), r["schedule"], r["seconds"] * 1e3, r["busbw_gbs"],
                 100 * r["bound_seconds"] / r["seconds"], r["seconds"] / small[(size, sched)]["seconds"]))
        p("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
