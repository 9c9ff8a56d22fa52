"""Helpers the benchmark report scripts share (cluster-bench-summary.py,
cluster-scaling-report.py): sizes as the benchmarks print them, and their JSON."""
import json


def human(n):
    """The shortest exact spelling of n bytes, as tools/cli.h prints it: 16M, 1K, 4097."""
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def load(path, missing_ok=False):
    """The JSON at path; None when missing_ok and it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        if missing_ok:
            return None
        raise
