#!/usr/bin/python3
"""What the timeline trace costs: p2p 8 B latency and coll_bench allreduce times of a
reference build (without the trace hooks, e.g. the parent commit), of this build with
RDMAFLOW_TRACE unset and of this build with it set, run in turn round after round so
that the machine's drift hits all three alike. Prints medians over the rounds and the
ratios to the reference (docs/observability.md, "Overhead").

Usage: scripts/trace-overhead.py --ref REF_BUILD --new NEW_BUILD [--rounds N]

REF_BUILD and NEW_BUILD are build directories (bench/p2p/p2p and
bench/collectives/rdmaflow_coll_bench inside) or directories holding the two
executables. Needs mpirun for coll_bench. Run it alone (it times things).
Standard library only; run with /usr/bin/python3.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

SIZES = "8,64K,1M"


def exe(build, rel):
    for p in (os.path.join(build, rel), os.path.join(build, os.path.basename(rel))):
        if os.path.exists(p):
            return p
    raise SystemExit(f"trace-overhead: no {rel} in {build}")


def p2p(binary, env):
    out = subprocess.run([binary, "--transport", "tcp", "--transport", "ucx_shm", "--no-grpc",
                          "--link-seconds", "0", "--lat-max", "8", "--bw-min", "1K", "--bw-max",
                          "1K", "--seconds", "0.5", "--json"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         timeout=300, check=True).stdout
    return {f"p2p {r['transport']} 8 B p50 (us)": r["latency_us"][0]["transport_p50"]
            for r in json.loads(out)["rows"]}


def coll(binary, env, transport, tmp):
    path = os.path.join(tmp, "coll.json")
    subprocess.run([shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "4"]
                   + [a for k in ("RDMAFLOW_TRACE",) if k in env for a in ("-x", k)]
                   + [binary, "--transport", transport, "--sizes", SIZES, "-n", "50", "-w", "5",
                      "--json", path],
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600,
                   check=True)
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    return {f"allreduce {transport} {r['size']} B p50 (us)": r["rdmaflow"]["time_us"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RDMAFLOW_TRACE")}
    results = {"ref": {}, "off": {}, "on": {}}
    with tempfile.TemporaryDirectory(prefix="rdmaflow-trace-overhead-") as tmp:
        on_env = dict(base_env, RDMAFLOW_TRACE=os.path.join(tmp, "trace"))
        configs = [("ref", args.ref, base_env), ("off", args.new, base_env),
                   ("on", args.new, on_env)]
        for rnd in range(args.rounds):
            for name, build, env in configs:
                figures = p2p(exe(build, "bench/p2p/p2p"), env)
                for transport in ("tcp", "auto"):
                    figures.update(coll(exe(build, "bench/collectives/rdmaflow_coll_bench"), env,
                                        transport, tmp))
                for k, v in figures.items():
                    results[name].setdefault(k, []).append(v)
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    # Ratios are taken round by round (the three configurations of a round ran
    # back to back) and their median printed, with the spread over the rounds.
    print(f"{'median over ' + str(args.rounds) + ' rounds':40} {'reference':>9} {'off':>9} "
          f"{'on':>9}   {'off/ref (min-max)':>20}   {'on/ref (min-max)':>20}")
    for key in results["ref"]:
        ref, off, on = (results[c][key] for c in ("ref", "off", "on"))
        r_off = [o / r for o, r in zip(off, ref)]
        r_on = [o / r for o, r in zip(on, ref)]

        def spread(r):
            return f"{statistics.median(r):5.2f} ({min(r):4.2f}-{max(r):4.2f})"

        print(f"{key:40} {statistics.median(ref):9.2f} {statistics.median(off):9.2f} "
              f"{statistics.median(on):9.2f}   {spread(r_off):>20}   {spread(r_on):>20}")

if __name__ == "__main__":
    main()
