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
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("network-targets: tables and the selector verdict from real sweeps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
