#!/usr/bin/python3
"""scripts/plot-bench.py on the benchmarks' real JSON (docs/img/data/, the runs
behind the figures of docs/benchmarks.md and docs/compression.md).

  plot_bench_test.py SOURCE_ROOT     (ctest: tools.plot_bench)

Every data set must give its figures as PNG files; a JSON no benchmark wrote
and files of two benchmarks at once must be refused with exit status 2 and a
message naming the problem.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, failures  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
def plot(root, prefix, files):
    script = os.path.join(root, "scripts", "plot-bench.py")
    return subprocess.run(["/usr/bin/python3", script, prefix] + files, text=True,
                          capture_output=True, timeout=120)


def main(root):
    data = os.path.join(root, "docs", "img", "data")
    cases = {
        "p2p": (["p2p-one-host.json"], ["latency", "bandwidth"]),
        "coll": (["coll-one-host.json"], ["busbw"]),
        "codecs": ([f"codecs-1gbit-run{i}.json" for i in (1, 2, 3)], ["codecs"]),
        "e2e": (["e2e-one-host.json"], ["steps"]),
    }
    with tempfile.TemporaryDirectory() as d:
        for name, (files, figures) in cases.items():
            prefix = os.path.join(d, name)
            r = plot(root, prefix, [os.path.join(data, f) for f in files])
            check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr.strip()}")
            for fig in figures:
                path = f"{prefix}-{fig}.png"
                ok = os.path.exists(path)
                check(ok, f"{name}: no {path}")
                if ok:
                    with open(path, "rb") as f:
                        head = f.read(8)
                    check(head == PNG, f"{name}: {path} is not a PNG")
                    check(os.path.getsize(path) > 10000, f"{name}: {path} is nearly empty")
                    check(path in r.stdout, f"{name}: {path} not printed")
        foreign = os.path.join(d, "foreign.json")
        with open(foreign, "w") as f:
            json.dump({"rows": [{"something": 1}]}, f)
        r = plot(root, os.path.join(d, "x"), [foreign])
        check(r.returncode == 2 and "foreign.json" in r.stderr,
              f"a foreign JSON: exit {r.returncode}, stderr {r.stderr.strip()!r}")
        r = plot(root, os.path.join(d, "y"),
                 [os.path.join(data, "p2p-one-host.json"), os.path.join(data, "e2e-one-host.json")])
        check(r.returncode == 2 and "different benchmarks" in r.stderr,
              f"two benchmarks at once: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("plot-bench: every data set plotted, bad input refused")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
