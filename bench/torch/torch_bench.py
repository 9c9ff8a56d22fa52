#!/usr/bin/python3
"""torch.distributed on rdmaflow beside Gloo, in the same run.

For each backend (rdmaflow, then gloo), WORLD processes on this host (or
under mpirun across hosts) run
  - an all_reduce busbw sweep (float32, sum; nccl-tests columns: p50 time of
    the slowest rank, algbw, busbw = algbw x 2(n-1)/n), and
  - DDP training steps of a communication-heavy model (three 4096-wide
    linear layers on one sample: 50M parameters, 200 MB of gradients per
    step) and of
    torchvision's resnet18 (11.7M parameters) on small synthetic images:
    the median step time after warm-up,
then prints each figure beside Gloo's and the ratio (> 1: rdmaflow faster).

  bench/torch/torch_bench.py [--world 2] [--sizes 8,64K,1M,16M,64M] [--json FILE]
  bench/torch/torch_bench.py --cluster 0 --hosts 2 --per-host 1   # simulated hosts
  RDMAFLOW_TRANSPORT=tcp RDMAFLOW_COLL_STAGE=1 bench/torch/torch_bench.py --registered
      # also rdmaflow.torch.empty tensors: staging copies against none
  bench/torch/torch_bench.py --rounds 3 --variant nocheck:RDMAFLOW_TORCH_CHECK=0
      # A/B: rdmaflow as it is, rdmaflow under each variant's environment and
      # Gloo, interleaved in 3 rounds; each figure the median of its rounds

With --cluster, rank r runs on host h<r / per-host> of the simulated cluster
(scripts/cluster --id ID up --hosts K first): both backends then go over the
hosts' links (tbf-limited TCP) between hosts, and rdmaflow uses shared memory
within one.

Needs the package on PYTHONPATH (build/python) or installed.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"  # Debian's torch is installed for it


def parse_size(text):
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def human(n):
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


# ------------------------------------------------------------------ worker

def make_model(name):
    """The model, one batch of inputs and targets, and the loss (seeded alike everywhere)."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    if name == "comm-heavy":
        width = 4096
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                              nn.ReLU(), nn.Linear(width, width))
        # One sample: Debian's CPU torch computes these layers at a few
        # GFLOP/s, so a larger batch would make the step compute-bound.
        return model, torch.randn(1, width), torch.randn(1, width), nn.MSELoss()
    import torchvision
    model = torchvision.models.resnet18(num_classes=10)
    return (model, torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)),
            nn.CrossEntropyLoss())


def timed_step(dist, agree, ddp, x, y, loss_fn, opt):
    """One DDP training step after a barrier: (wall seconds, CPU seconds of the process)."""
    dist.barrier(group=agree)
    c0 = time.process_time()  # every thread of this process, user + system
    t0 = time.perf_counter()
    opt.zero_grad()
    loss_fn(ddp(x), y).backward()
    opt.step()
    return time.perf_counter() - t0, time.process_time() - c0


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rdmaflow.torch

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", args.rank))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", args.world))
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group(args.backend, init_method=f"tcp://{args.master}:{args.port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    # Timings are agreed on over Gloo, outside what is measured.
    agree = dist.new_group(backend="gloo")

    def slowest(times):
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=agree)
        return t.tolist()

    def p50_allreduce(x, iters):
        for _ in range(3):
            dist.all_reduce(x)
        dist.barrier(group=agree)
        times, calls = [], []
        for _ in range(iters):
            t0 = time.perf_counter()
            work = dist.all_reduce(x, async_op=True)  # what all_reduce(x) does, timed in two
            t1 = time.perf_counter()
            work.wait()
            times.append(time.perf_counter() - t0)
            calls.append(t1 - t0)
        # The call alone (until the Work is returned: what the backend does on
        # the caller's thread) beside the whole, both of the slowest rank.
        return statistics.median(slowest(times)), statistics.median(slowest(calls))

    out = {"backend": args.backend, "world": world, "allreduce": [], "ddp": {}}
    for size in args.sizes:
        n = max(1, size // 4)
        iters = max(5, min(200, (256 << 20) // max(size, 1)))
        p50, call = p50_allreduce(torch.ones(n), iters)
        algbw = n * 4 / p50 / 1e9
        row = {"size": n * 4, "time_us": p50 * 1e6, "call_us": call * 1e6, "algbw_gbs": algbw,
               "busbw_gbs": algbw * 2 * (world - 1) / world if world > 1 else algbw,
               "iters": iters}
        if args.registered and args.backend == "rdmaflow":
            reg = rdmaflow.torch.empty(n)
            reg.fill_(1)
            row["registered_time_us"] = p50_allreduce(reg, iters)[0] * 1e6
            row["staging"] = rdmaflow.torch.stats()
        out["allreduce"].append(row)
    for model_name in args.models:
        model, x, y, loss_fn = make_model(model_name)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        steps = []
        for step in range(args.warmup + args.steps):
            wall, _ = timed_step(dist, agree, ddp, x, y, loss_fn, opt)
            if step >= args.warmup:
                steps.append(wall)
        steps = slowest(steps)
        params = sum(p.numel() for p in model.parameters())
        out["ddp"][model_name] = {"step_ms": statistics.median(steps) * 1e3,
                                  "params": params, "grad_bytes": params * 4,
                                  "steps": args.steps}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def worker_interleaved(args):
    """--interleave: every configuration is a process group of this one job
    (each rdmaflow group made with its variant's environment set), and the
    timed calls and DDP steps alternate between the groups, A B C A B C ...:
    each sees the same machine load, at the cost of sharing the process."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rdmaflow.torch  # noqa: F401 (registers the backend)

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", args.rank))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", args.world))
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    agree = dist.new_group(backend="gloo")
    groups = {}
    for label, backend, env in json.loads(args.groups):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read when the group is made
        groups[label] = dist.new_group(backend=backend)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v

    def slowest(times):
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=agree)
        return t.tolist()

    def rotated(items, k):
        # Iteration k starts with configuration k: none always runs right
        # after the same other one (DDP steps measured 10-15% slower in the
        # second place than in the first, whatever ran there).
        items = list(items)
        k %= len(items)
        return items[k:] + items[:k]

    out = {label: {"backend": label, "world": world, "allreduce": [], "ddp": {}}
           for label in groups}
    for size in args.sizes:
        n = max(1, size // 4)
        iters = max(5, min(200, (256 << 20) // max(size, 1))) * args.rounds
        x = torch.ones(n)
        times = {label: [] for label in groups}
        calls = {label: [] for label in groups}
        cpus = {label: [] for label in groups}
        for g in groups.values():
            for _ in range(3):
                dist.all_reduce(x, group=g)
        for it in range(iters):
            for label, g in rotated(groups.items(), it):
                dist.barrier(group=agree)
                c0 = time.process_time()  # every thread of this process, user + system
                t0 = time.perf_counter()
                work = dist.all_reduce(x, group=g, async_op=True)
                t1 = time.perf_counter()
                work.wait()
                times[label].append(time.perf_counter() - t0)
                cpus[label].append(time.process_time() - c0)
                calls[label].append(t1 - t0)
        for label in groups:
            p50 = statistics.median(slowest(times[label]))
            algbw = n * 4 / p50 / 1e9
            out[label]["allreduce"].append({
                "size": n * 4, "time_us": p50 * 1e6,
                "call_us": statistics.median(slowest(calls[label])) * 1e6,
                # CPU the rank spent (all its threads; the mean, as the clock
                # ticks coarsely): on 2 shared cores, what DDP's backward loses.
                "cpu_us": statistics.mean(slowest(cpus[label])) * 1e6, "algbw_gbs": algbw,
                "busbw_gbs": algbw * 2 * (world - 1) / world if world > 1 else algbw,
                "iters": iters})
    for model_name in args.models:
        # Each group trains its own copy of the model (the same seed), one
        # step of each in turn.
        runs = {}
        for label, g in groups.items():
            model, x, y, loss_fn = make_model(model_name)
            ddp = DDP(model, process_group=g)
            runs[label] = (ddp, x, y, loss_fn, torch.optim.SGD(ddp.parameters(), lr=0.01), [],
                           [])
        for step in range(args.warmup + args.steps * args.rounds):
            for label, (ddp, x, y, loss_fn, opt, steps, cpus) in rotated(runs.items(), step):
                wall, cpu = timed_step(dist, agree, ddp, x, y, loss_fn, opt)
                if step >= args.warmup:
                    steps.append(wall)
                    cpus.append(cpu)
        for label, (ddp, _, _, _, _, steps, cpus) in runs.items():
            params = sum(p.numel() for p in ddp.module.parameters())
            out[label]["ddp"][model_name] = {
                "step_ms": statistics.median(slowest(steps)) * 1e3, "params": params,
                "cpu_ms": statistics.mean(slowest(cpus)) * 1e3,
                "grad_bytes": params * 4, "steps": len(steps)}
        del runs
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


# ------------------------------------------------------------------ launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_script():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                        "cluster")


def rank_prefix(args, rank):
    """The command prefix that runs `rank` where it belongs: here, or on its host."""
    if args.cluster is None:
        return []
    return [cluster_script(), "--id", str(args.cluster), "exec", f"h{rank // args.per_host}"]


def run_backend(args, backend, out, env=None, groups=None):
    """One job of `backend` on every rank, with `env` added to the environment
    (or, with `groups`, one job of every configuration: --interleave)."""
    port = str(free_port())
    cmd = [PYTHON, os.path.abspath(__file__), "--worker", "--backend", backend, "--port", port,
           "--master", args.master,
           "--world", str(args.world), "--out", out, "--sizes",
           ",".join(map(str, args.sizes)), "--models", ",".join(args.models),
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--timeout", str(args.timeout)]
    if args.registered:
        cmd.append("--registered")
    if groups is not None:
        cmd += ["--groups", json.dumps(groups), "--rounds", str(args.rounds)]
    environ = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen(rank_prefix(args, r) + cmd + ["--rank", str(r)], env=environ)
             for r in range(args.world)]
    rcs = [p.wait() for p in procs]
    if any(rcs):
        sys.exit(f"torch_bench: the {backend} run failed (exit codes {rcs})")
    with open(out) as f:
        return json.load(f)


def median_of_rounds(runs):
    """One backend's results over rounds: each figure the median of its rounds
    (the rounds' own figures kept beside it)."""
    merged = json.loads(json.dumps(runs[0]))
    for i, row in enumerate(merged["allreduce"]):
        times = [r["allreduce"][i]["time_us"] for r in runs]
        row["time_us"] = statistics.median(times)
        row["rounds_us"] = times
        for key in ("call_us", "cpu_us"):
            if all(key in r["allreduce"][i] for r in runs):
                row[key] = statistics.median(r["allreduce"][i][key] for r in runs)
        row["algbw_gbs"] = row["size"] / (row["time_us"] * 1e-6) / 1e9
        world = merged["world"]
        row["busbw_gbs"] = row["algbw_gbs"] * (2 * (world - 1) / world if world > 1 else 1)
    for name, d in merged["ddp"].items():
        steps = [r["ddp"][name]["step_ms"] for r in runs]
        d["step_ms"] = statistics.median(steps)
        d["rounds_ms"] = steps
        if all("cpu_ms" in r["ddp"][name] for r in runs):
            d["cpu_ms"] = statistics.median(r["ddp"][name]["cpu_ms"] for r in runs)
    return merged


def parse_variant(text):
    """LABEL:VAR=VALUE[,VAR=VALUE...] -> (label, {VAR: VALUE})."""
    label, sep, assigns = text.partition(":")
    env = {}
    for a in assigns.split(",") if sep else []:
        var, eq, value = a.partition("=")
        if not eq or not var:
            raise ValueError(f"--variant '{text}': expected LABEL:VAR=VALUE[,VAR=VALUE...]")
        env[var] = value
    if not label or not env or label in ("rdmaflow", "gloo"):
        raise ValueError(f"--variant '{text}': expected LABEL:VAR=VALUE[,VAR=VALUE...] "
                         "(a label other than rdmaflow and gloo)")
    return label, env


def report_variants(base, gloo, variants):
    """Each variant beside rdmaflow as it is and Gloo (ratio = base time / variant time)."""
    lines = []
    for label, (env, v) in variants.items():
        lines.append("")
        lines.append("# variant %s (%s): p50 us (of each round, or the CPU us a call took); "
                     "ratio = rdmaflow / variant" % (
            label, " ".join(f"{k}={val}" for k, val in env.items())))
        lines.append("%8s | %26s | %26s | %26s | %6s" % ("size", "rdmaflow", label, "gloo",
                                                         "ratio"))
        for a, b, g in zip(base["allreduce"], v["allreduce"], gloo["allreduce"]):
            def fmt(row):
                if "cpu_us" in row:  # --interleave: one round, and the CPU it took
                    return "%9.1f (cpu %7.0f)" % (row["time_us"], row["cpu_us"])
                return "%9.1f (%s)" % (row["time_us"], ",".join("%.0f" % t for t in
                                                               row.get("rounds_us", [])))
            lines.append("%8s | %26s | %26s | %26s | %5.2fx" % (
                human(a["size"]), fmt(a), fmt(b), fmt(g), a["time_us"] / b["time_us"]))
        for name, d in v["ddp"].items():
            a, g = base["ddp"][name], gloo["ddp"][name]
            lines.append("%-11s DDP step: rdmaflow %8.2f ms, %s %8.2f ms, gloo %8.2f ms: "
                         "%5.2fx" % (name, a["step_ms"], label, d["step_ms"], g["step_ms"],
                                     a["step_ms"] / d["step_ms"]))
    return lines


def report(ours, gloo, where):
    world = ours["world"]
    lines = [f"# torch.distributed all_reduce, float32 sum, {world} ranks {where}; "
             "p50 of the slowest rank; ratio = rdmaflow busbw / Gloo busbw",
             "%8s | %12s %10s | %12s %10s | %7s" % ("size", "rdmaflow us", "busbw GB/s",
                                                   "gloo us", "busbw GB/s", "ratio")]
    rows = []
    for a, b in zip(ours["allreduce"], gloo["allreduce"]):
        ratio = a["busbw_gbs"] / b["busbw_gbs"] if b["busbw_gbs"] else 0
        rows.append({"size": a["size"], "rdmaflow": a, "gloo": b, "ratio": ratio})
        lines.append("%8s | %12.1f %10.3f | %12.1f %10.3f | %6.2fx" % (
            human(a["size"]), a["time_us"], a["busbw_gbs"], b["time_us"], b["busbw_gbs"], ratio))
        lines[-1] += "  | rdmaflow's call returns after %8.1f us" % a.get("call_us", 0)
        if "cpu_us" in a:
            lines[-1] += "; CPU per call: rdmaflow %8.0f us, gloo %8.0f us" % (a["cpu_us"],
                                                                             b["cpu_us"])
        if "registered_time_us" in a:
            lines[-1] += "  | rdmaflow.torch.empty: %10.1f us" % a["registered_time_us"]
    lines.append("")
    lines.append("# DDP step time (median after warm-up, slowest rank); ratio = Gloo / rdmaflow")
    ddp = {}
    for name, a in ours["ddp"].items():
        b = gloo["ddp"][name]
        ratio = b["step_ms"] / a["step_ms"]
        ddp[name] = {"rdmaflow_ms": a["step_ms"], "gloo_ms": b["step_ms"], "ratio": ratio,
                     "params": a["params"]}
        lines.append("%-11s (%5.1fM params): rdmaflow %8.2f ms, gloo %8.2f ms: %5.2fx" % (
            name, a["params"] / 1e6, a["step_ms"], b["step_ms"], ratio))
        if "cpu_ms" in a:
            lines[-1] += "; CPU per step: rdmaflow %8.2f ms, gloo %8.2f ms" % (a["cpu_ms"],
                                                                             b["cpu_ms"])
    return {"world": world, "where": where, "allreduce": rows, "ddp": ddp}, lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="ranks on this host (default 2)")
    p.add_argument("--sizes", default="8,64K,1M,4M,16M,64M",
                   help="all_reduce sizes in bytes, K/M suffixes (default 8,64K,1M,4M,16M,64M)")
    p.add_argument("--models", default="comm-heavy,resnet18",
                   help="DDP models: comm-heavy, resnet18 (default both)")
    p.add_argument("--steps", type=int, default=10, help="timed DDP steps (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed DDP steps first (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--timeout", type=float, default=300, help="group timeout, s (default 300)")
    p.add_argument("--cluster", type=int, help="run the ranks on simulated cluster ID's hosts "
                   "(scripts/cluster; default: all on this host)")
    p.add_argument("--hosts", type=int, default=2, help="with --cluster: hosts used (default 2)")
    p.add_argument("--per-host", type=int, default=1,
                   help="with --cluster: ranks per host (default 1); --world = hosts x per-host")
    p.add_argument("--registered", action="store_true",
                   help="rdmaflow also times each size on an rdmaflow.torch.empty tensor "
                   "(with RDMAFLOW_COLL_STAGE=1: staged against registered sources)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the backends (and variants) this many times, interleaved; each "
                   "figure is the median of its rounds (default 1)")
    p.add_argument("--variant", action="append", default=[],
                   help="LABEL:VAR=VALUE[,VAR=VALUE...]: also run rdmaflow with these "
                   "environment variables set, interleaved with the others (repeatable)")
    p.add_argument("--interleave", action="store_true",
                   help="one job in which every configuration (rdmaflow, each variant, Gloo) "
                   "is a process group and the timed calls and steps alternate between them; "
                   "--rounds then multiplies the iterations")
    p.add_argument("--json", help="also write the report as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="rdmaflow", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", default="29555", help=argparse.SUPPRESS)
    p.add_argument("--master", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--groups", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in ("comm-heavy", "resnet18"):
            p.error(f"unknown model '{m}' (comm-heavy, resnet18)")
    if args.worker:
        return worker_interleaved(args) if args.groups else worker(args)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        p.error(str(e))
    if args.cluster is not None:
        if args.hosts < 1 or args.per_host < 1:
            p.error("--hosts and --per-host must be at least 1")
        args.world = args.hosts * args.per_host
        # Host h0's address in the cluster's subnet (docs/cluster.md).
        args.master = f"10.77.{args.cluster}.10"
        where = f"on {args.hosts} simulated hosts x {args.per_host}"
    else:
        args.master = "127.0.0.1"
        where = "on this host"
    # Cluster hosts have their own /tmp: results go through the working directory.
    scratch = os.getcwd() if args.cluster is not None else None
    configs = [("rdmaflow", "rdmaflow", {})]
    configs += [(label, "rdmaflow", env) for label, env in variants.items()]
    configs.append(("gloo", "gloo", {}))
    runs = {label: [] for label, _, _ in configs}
    with tempfile.TemporaryDirectory(prefix="torch_bench.", dir=scratch) as tmp:
        if args.interleave:
            one = run_backend(args, "gloo", os.path.join(tmp, "all.json"), groups=configs)
            runs = {label: [one[label]] for label in runs}
        else:
            for r in range(args.rounds):
                for label, backend, env in configs:
                    out = os.path.join(tmp, f"{label}.{r}.json")
                    runs[label].append(run_backend(args, backend, out, env))
    results = {label: median_of_rounds(rs) for label, rs in runs.items()}
    summary, lines = report(results["rdmaflow"], results["gloo"], where)
    if args.interleave:
        lines[0] += "; every configuration a group of one job, calls alternating between them"
    elif args.rounds > 1:
        lines[0] += f"; median of {args.rounds} interleaved rounds"
    if variants:
        lines += report_variants(results["rdmaflow"], results["gloo"],
                                 {label: (env, results[label]) for label, env in variants.items()})
        summary["variants"] = {label: {"env": env, "result": results[label]}
                               for label, env in variants.items()}
    summary["rounds"] = args.rounds
    summary["rdmaflow_rounds"] = runs["rdmaflow"]
    summary["gloo_rounds"] = runs["gloo"]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
