#!/usr/bin/env python3
"""bench/p2p over verbs beside rdma-core's own perftest, in one run, on one rxe device.

Run inside the soft-RoCE guest (it needs an RDMA device):

    scripts/softroce-vm -- python3 scripts/softroce/bench_p2p.py [--build-dir build] [--json OUT]

For every size bench/p2p measures, it runs ib_write_lat (one-way latency, half
the ping-pong round trip: what p2p reports too) and ib_write_bw (RDMA writes,
perftest's default 128 in flight against p2p's window of 16-64 writes), both
connecting through rdma_cm as rdmaflow does (-R), and prints rdmaflow's figure,
perftest's and the ratio. Under software emulation the absolute figures mean
little; the ratio says whether rdmaflow adds overhead to the verbs it posts.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def run(cmd, timeout):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


PORT = [18515]


def perftest(tool, size, iters, device, server_ip, extra):
    """Runs one perftest server/client pair on a port of its own; returns the client's
    stdout. A pair that does not finish in two minutes is killed and tried again."""
    for attempt in range(3):
        PORT[0] += 1
        base = [tool, "-d", device, "-R", "-p", str(PORT[0]), "-s", str(size), "-n", str(iters)]
        base += extra
        server = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(25):  # the server needs a moment to listen
                time.sleep(0.2)
                client = run(base + [server_ip], 120)
                if client.returncode == 0:
                    return client.stdout
        except subprocess.TimeoutExpired:
            print(f"   {tool} -s {size}: no result within 120 s, trying again", flush=True)
        finally:
            server.kill()
            server.wait()
    raise RuntimeError(f"{tool} -s {size} failed three times")


def result_row(text, columns):
    """The numbers of perftest's result line (the one that starts with the size)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= columns and re.fullmatch(r"\d+", fields[0]):
            try:
                return [float(x) for x in fields[:columns]]
            except ValueError:
                continue
    raise RuntimeError("no result line in perftest output:\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--build-dir", default=os.path.join(root, "build"))
    ap.add_argument("--device", default="rxe0")
    ap.add_argument("--ip", default=os.environ.get("RF_VM_ADDRS", "10.77.0.1").split(",")[0])
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--full", action="store_true", help="every p2p size, not p2p --quick's")
    a = ap.parse_args()

    def p2p(extra):
        cmd = [os.path.join(a.build_dir, "bench", "p2p", "p2p"), "--transport", "verbs", "--no-grpc", "--json"] + extra
        if not a.full:
            cmd.append("--quick")
        print("running:", " ".join(cmd), flush=True)
        res = run(cmd, 3600)
        if res.returncode != 0:
            sys.exit(f"p2p failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return next(r for r in json.loads(res.stdout)["rows"] if r.get("transport") == "verbs")

    row = p2p([])
    spin = p2p(["--spin"])  # waits by polling, as perftest does
    spin_lat = {r["size"]: r for r in spin["latency_us"]}
    spin_bw = {r["size"]: r for r in spin["bandwidth_MBps"]}

    print("\nLatency, one-way us (p2p: notify ping-pong; ib_write_lat: write ping-pong, -R)")
    print(f"{'size':>10} {'rdmaflow p50':>13} {'ib_write_lat typ':>17} {'ratio':>7}"
          f" {'spin p50':>9} {'ratio':>7} {'rdmaflow avg':>13} {'ib avg':>9} {'ratio':>7}")
    lat = []
    for r in row["latency_us"]:
        size = r["size"]
        # bytes iterations t_min t_max t_typical t_avg ...
        v = result_row(perftest("ib_write_lat", size, 500 if size <= 4096 else 100,
                                a.device, a.ip, []), 6)
        typ, avg = v[4], v[5]
        lat.append({"size": size, "rdmaflow_p50": r["transport_p50"], "ib_typical": typ,
                    "ratio_p50": r["transport_p50"] / typ, "rdmaflow_avg": r["transport"],
                    "spin_p50": spin_lat[size]["transport_p50"],
                    "spin_ratio_p50": spin_lat[size]["transport_p50"] / typ,
                    "ib_avg": avg, "ratio_avg": r["transport"] / avg})
        x = lat[-1]
        print(f"{size:>10} {x['rdmaflow_p50']:>13.2f} {typ:>17.2f} {x['ratio_p50']:>7.2f}"
              f" {x['spin_p50']:>9.2f} {x['spin_ratio_p50']:>7.2f} {x['rdmaflow_avg']:>13.2f} {avg:>9.2f} {x['ratio_avg']:>7.2f}", flush=True)

    print("\nBandwidth, MB/s (p2p: windowed writes; ib_write_bw: RDMA writes, -R)")
    print(f"{'size':>10} {'rdmaflow':>10} {'ib_write_bw':>12} {'ratio':>7} {'spin':>10} {'ratio':>7}")
    bw = []
    for r in row["bandwidth_MBps"]:
        size = r["size"]
        iters = max(4, min(5000, (1 << 30) // size))  # about 1 GiB a size
        # bytes iterations BW_peak BW_average MsgRate  (MB/s are 2^20 bytes in perftest)
        v = result_row(perftest("ib_write_bw", size, iters, a.device, a.ip, []), 4)
        ib = v[3] * (1 << 20) / 1e6  # p2p's MB are 10^6 bytes
        sp = spin_bw[size]["transport"]
        bw.append({"size": size, "rdmaflow_MBps": r["transport"], "ib_MBps": ib,
                   "ratio": r["transport"] / ib, "spin_MBps": sp, "spin_ratio": sp / ib})
        print(f"{size:>10} {r['transport']:>10.1f} {ib:>12.1f} {r['transport'] / ib:>7.2f}"
              f" {sp:>10.1f} {sp / ib:>7.2f}", flush=True)

    if a.json:
        with open(a.json, "w") as f:
            json.dump({"latency_us": lat, "bandwidth_MBps": bw, "p2p": row, "p2p_spin": spin}, f,
                  indent=1)


if __name__ == "__main__":
    main()
