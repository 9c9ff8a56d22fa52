#!/usr/bin/env python3
"""The headline ratios of a scripts/cluster-bench directory.

Reads the JSON the benchmarks wrote (p2p.json, coll-<op>-<layout>.json,
e2e.json), prints the like-for-like figures (rdmaflow beside the references
measured on the same hosts in the same run) and writes them to summary.json.

  scripts/cluster-bench-summary.py DIR
"""
import glob
import json
import os
import sys

from bench_json import human, load


def p2p_summary(d):
    out = {"link_rate_MBps": d.get("link_rate", {}).get("best_MBps"), "rows": {}}
    lines = ["p2p between %s (link rate %s MB/s, plain TCP sockets; bandwidth ratios are the "
             "row's MB/s over the reference's, > 1: the row is faster):" % (
        " and ".join(d.get("hosts", [])),
        "%.0f" % out["link_rate_MBps"] if out["link_rate_MBps"] else "?")]
    for row in d.get("rows", []):
        name = row.get("transport")
        if "skipped" in row:
            lines.append(f"  {name}: skipped ({row['skipped'][:100]})")
            continue
        lat = row.get("latency_us", [])
        bw = row.get("bandwidth_MBps", [])
        out["rows"][name] = {"medium": row.get("medium"), "latency_us": lat, "bandwidth_MBps": bw}
        lines.append(f"  {name} (medium {row.get('medium')}):")
        for r in lat:
            lines.append("    latency   %6s: %8.1f us (p50 %7.1f); socket %7.1f us (p50 %7.1f); "
                         "gRPC %7.1f us; gRPC / it %.2fx"
                         % (human(r["size"]), r["transport"], r["transport_p50"], r["socket"],
                            r["socket_p50"], r.get("grpc", 0), r.get("ratio_grpc", 0)))
        for r in bw:
            lines.append("    bandwidth %6s: %6.0f MB/s; socket %6.0f (%.2fx); gRPC %6.0f (%.2fx); "
                         "%3.0f%% of the link"
                         % (human(r["size"]), r["transport"], r["socket"], r["ratio"],
                            r.get("grpc", 0), r.get("ratio_grpc", 0), 100 * r.get("ratio_link", 0)))
    return out, lines


def coll_summary(name, d):
    rows = []
    lines = [f"{name}: {d.get('op')} {d.get('type')}, {d.get('ranks')} ranks on hosts "
             f"{' '.join(d.get('hosts', []))}; rdmaflow {d.get('transport')} "
             f"(= {d.get('transport_chosen')}); Open MPI pml {d.get('mpi', {}).get('pml')} "
             f"btl {d.get('mpi', {}).get('btl')}; Gloo tcp",
             "    %8s | %-27s | %-27s | %-27s | %7s %7s" % (
                 "size", "rdmaflow time, busbw", "Open MPI time, busbw", "Gloo time, busbw",
                 "vs MPI", "vs Gloo")]
    for r in d.get("rows", []):
        ours = r.get("rdmaflow", {}).get("busbw_gbs", 0)
        mpi = r.get("mpi", {}).get("busbw_gbs", 0)
        gloo = r.get("gloo", {}).get("busbw_gbs", 0)
        row = {"size": r["size"], "rdmaflow_busbw_gbs": ours, "mpi_busbw_gbs": mpi,
               "gloo_busbw_gbs": gloo,
               "rdmaflow_time_us": r.get("rdmaflow", {}).get("time_us"),
               "mpi_time_us": r.get("mpi", {}).get("time_us"),
               "gloo_time_us": r.get("gloo", {}).get("time_us"),
               "vs_mpi": ours / mpi if mpi else None, "vs_gloo": ours / gloo if gloo else None}
        rows.append(row)
        def cell(t, b):
            return "%10.1f us %9.3f GB/s" % (t, b) if t else "%27s" % "-"
        lines.append("    %8s | %s | %s | %s | %7s %7s" % (
            human(r["size"]), cell(row["rdmaflow_time_us"], ours), cell(row["mpi_time_us"], mpi),
            cell(row["gloo_time_us"], gloo),
            "%.2fx" % row["vs_mpi"] if row["vs_mpi"] else "-",
            "%.2fx" % row["vs_gloo"] if row["vs_gloo"] else "-"))
    rounds = d.get("rounds", 1)
    how = ("p50 time of the slowest rank" if rounds <= 1 else
           f"the slowest rank's time, median of {rounds} interleaved rounds' medians")
    lines.append(f"    ({how}; busbw in the nccl-tests convention; "
                 "vs = rdmaflow's busbw / the reference's, > 1: rdmaflow faster)")
    return rows, lines


def e2e_summary(d):
    out = {}
    lines = ["e2e on %s (link rate %s MB/s):" % (
        d.get("hosts", "one host"),
        "%.0f" % d["link_rate"]["best_MBps"] if "link_rate" in d else "?")]
    for cfg in ("comm-heavy", "compute-heavy", "16 MiB tensor"):
        rows = {r["transport"]: r for r in d.get(cfg, []) if "step_ms_median" in r}
        bound = d.get("link_bound", {}).get(cfg, {}).get("bound_ms")
        tcp = rows.get("tcp", {}).get("step_ms_median")
        grpc = rows.get("grpc", {}).get("step_ms_median")
        grpc_default = rows.get("grpc:default-malloc", {}).get("step_ms_median")
        out[cfg] = {"tcp_ms": tcp, "grpc_tuned_ms": grpc, "grpc_default_malloc_ms": grpc_default,
                    "tcp_vs_grpc_tuned": grpc / tcp if tcp and grpc else None,
                    "link_bound_ms": bound,
                    "tcp_over_bound": tcp / bound if tcp and bound else None,
                    "rows": {k: {"step_ms": v["step_ms_median"], "medium": v.get("medium")}
                             for k, v in rows.items()}}
        if tcp and grpc:
            lines.append("  %-14s tcp %7.2f ms, gRPC tuned %7.2f ms (default malloc %s): "
                         "tcp is %.2fx gRPC tuned; link bound %s" % (
                             cfg, tcp, grpc,
                             "%.2f ms" % grpc_default if grpc_default else "-", grpc / tcp,
                             "%.2f ms (tcp at %.2fx it)" % (bound, tcp / bound) if bound else "-"))
    return out, lines


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    summary = {}
    lines = ["", "## headline: like for like, references measured on the same hosts in the same run"]
    p2p = load(os.path.join(d, "p2p.json"), missing_ok=True)
    if p2p:
        summary["p2p"], more = p2p_summary(p2p)
        lines += [""] + more
    coll = {}
    for path in sorted(glob.glob(os.path.join(d, "coll-*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        data = load(path, missing_ok=True)
        if data:
            coll[name], more = coll_summary(name, data)
            lines += [""] + more
    if coll:
        summary["collectives"] = coll
    e2e = load(os.path.join(d, "e2e.json"), missing_ok=True)
    if e2e:
        summary["e2e"], more = e2e_summary(e2e)
        lines += [""] + more
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
