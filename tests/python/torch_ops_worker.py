"""One rank of test_torch_backend.py: every operation of the "rdmaflow"
backend beside the Gloo backend on the same inputs, in this process.

    torch_ops_worker.py RANK WORLD PORT

Prints "rank R: ok (N checks)" and exits 0, or raises.
"""
import datetime
import sys

import torch
import torch.distributed as dist

import rdmaflow.torch  # noqa: F401  (registers the backend)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX}


def tol(dtype):
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)


def same(a, b, dtype, what):
    if dtype.is_floating_point:
        ok = torch.allclose(a.double(), b.double(), rtol=tol(dtype), atol=tol(dtype))
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise AssertionError(f"{what}: rdmaflow {a.tolist()} != gloo {b.tolist()}")


def gloo_dtype(t):
    """Gloo (torch 1.13) has no bfloat16: its reference runs in float64."""
    return t.double() if t.dtype == torch.bfloat16 else t


def on_gloo(fn, t, *args, **kw):
    """Runs fn (a torch.distributed call, in place on t) on Gloo; returns t's result."""
    x = gloo_dtype(t)
    fn(x, *args, **kw)
    return x.to(t.dtype) if x is not t else t


def inputs(rank, n, dtype, op, salt=0):
    # Values that stay exact in every dtype: products of 1s and 2s, small sums.
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if op == "product":
        v = torch.randint(1, 3, (n,), generator=g)
    else:
        v = torch.randint(0, 5 if dtype in (torch.uint8, torch.int8) else 50, (n,), generator=g)
    return v.to(dtype)


def split(src, dst):
    """Rows rank src sends rank dst in the uneven cases: 0 to 2, some empty."""
    return (2 * src + dst) % 3


def layout_ops(rank, world, dtype, gloo):
    """alltoall with uneven splits, gather, scatter, all_gather_coalesced and
    send/recv, each beside Gloo on the same inputs. Returns the checks made."""
    checks = 0
    src = inputs(rank, 2 * sum(split(rank, p) for p in range(world)), dtype, "sum", salt=40)
    src = src.reshape(-1, 2)
    ins = [split(rank, p) for p in range(world)]
    outs = [split(p, rank) for p in range(world)]
    out_r = torch.full((sum(outs), 2), 99, dtype=dtype)
    out_g = gloo_dtype(torch.zeros(sum(outs), 2, dtype=dtype))
    dist.all_to_all_single(out_r, src, outs, ins)
    dist.all_to_all_single(out_g, gloo_dtype(src), outs, ins, group=gloo)
    same(out_r, out_g.to(dtype), dtype, f"all_to_all_single uneven {dtype}")
    # The list form (Gloo has none): the same blocks, as the uneven single call moved them.
    lists_out = [torch.zeros(n, 2, dtype=dtype) for n in outs]
    dist.all_to_all(lists_out, list(src.split(ins)))
    same(torch.cat(lists_out), out_g.to(dtype), dtype, f"all_to_all uneven {dtype}")
    checks += 2
    for root in sorted({0, world - 1}):
        x = inputs(rank, 5, dtype, "sum", salt=50 + root)
        got = [torch.zeros(5, dtype=dtype) for _ in range(world)] if rank == root else None
        ref = [gloo_dtype(torch.zeros(5, dtype=dtype)) for _ in range(world)] if rank == root else None
        dist.gather(x, got, dst=root)
        dist.gather(gloo_dtype(x), ref, dst=root, group=gloo)
        if rank == root:
            same(torch.cat(got), torch.cat(ref).to(dtype), dtype, f"gather {dtype} root {root}")
        parts = [inputs(rank, 4, dtype, "sum", salt=60 + p) for p in range(world)]
        mine, ref1 = torch.zeros(4, dtype=dtype), gloo_dtype(torch.zeros(4, dtype=dtype))
        dist.scatter(mine, parts if rank == root else None, src=root)
        dist.scatter(ref1, [gloo_dtype(p) for p in parts] if rank == root else None, src=root,
                     group=gloo)
        same(mine, ref1.to(dtype), dtype, f"scatter {dtype} root {root}")
        checks += 2
    ts = [inputs(rank, k, dtype, "sum", salt=70 + k) for k in (1, 6)]
    got = [[torch.zeros(k, dtype=dtype) for k in (1, 6)] for _ in range(world)]
    ref = [[gloo_dtype(torch.zeros(k, dtype=dtype)) for k in (1, 6)] for _ in range(world)]
    dist.all_gather_coalesced(got, ts)
    dist.all_gather_coalesced(ref, [gloo_dtype(t) for t in ts], group=gloo)
    for r in range(world):
        for a, b in zip(got[r], ref[r]):
            same(a, b.to(dtype), dtype, f"all_gather_coalesced {dtype}")
    checks += 1
    if world > 1:  # a ring of send/recv, into a tensor that is not contiguous
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        x = inputs(rank, 12, dtype, "sum", salt=80)
        into = torch.zeros(4, 3, dtype=dtype).t()
        ref = gloo_dtype(torch.zeros(3, 4, dtype=dtype))
        works = [dist.isend(x.reshape(3, 4), nxt, tag=5), dist.irecv(into, prv, tag=5)]
        for w in works:
            w.wait()
        works = [dist.isend(gloo_dtype(x.reshape(3, 4)), nxt, group=gloo, tag=5),
                 dist.irecv(ref, prv, group=gloo, tag=5)]
        for w in works:
            w.wait()
        same(into, ref.to(dtype), dtype, f"send/recv {dtype}")
        batch = torch.zeros(3, 4, dtype=dtype)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x.reshape(3, 4), nxt),
                                         dist.P2POp(dist.irecv, batch, prv)]):
            w.wait()
        same(batch, ref.to(dtype), dtype, f"batch_isend_irecv {dtype}")
        checks += 2
    return checks


def errors_across_ranks(rank, world):
    """Calls the ranks disagree on, and recv of a message not its own, raise."""
    checks = 0
    if world == 1:
        return checks
    for what, call in [
        ("size", lambda: dist.all_reduce(torch.ones(3 + (rank == world - 1)))),
        ("dtype", lambda: dist.broadcast(torch.ones(3, dtype=torch.float64 if rank else torch.float32), 0)),
        ("root", lambda: dist.broadcast(torch.ones(3), rank % 2)),
        ("op", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.MAX if rank else dist.ReduceOp.SUM)),
        ("gather", lambda: dist.gather(torch.ones(2 + rank), [torch.ones(2)] * world if rank == 0 else None)),
    ]:
        try:
            call()
        except RuntimeError as e:
            assert "disagree" in str(e) or "ranks" in str(e), f"{what}: {e}"
            checks += 1
        else:
            raise AssertionError(f"a mismatch of {what} across ranks did not raise")
    # Uneven splits that do not match pairwise: alltoallv refuses them on both sides.
    ins = [1] * world
    outs = [1 + (rank == 0 and p == 1) for p in range(world)]
    try:
        dist.all_to_all_single(torch.zeros(sum(outs)), torch.ones(world), outs, ins)
    except RuntimeError as e:
        assert "alltoallv" in str(e), e
        checks += 1
    else:
        assert rank not in (0, 1), "mismatched splits did not raise"
    if rank < 2:  # a recv whose tag is not the message's
        if rank == 0:
            dist.send(torch.ones(4), 1, tag=1)
        else:
            try:
                dist.recv(torch.ones(4), 0, tag=2)
            except RuntimeError as e:
                assert "tag 1" in str(e), e
                checks += 1
            else:
                raise AssertionError("a recv of the wrong tag did not raise")
    try:
        dist.recv(torch.ones(4))
    except RuntimeError as e:
        assert "any source" in str(e), e
        checks += 1
    dist.barrier()  # the group is still usable
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [world, world], t
    return checks


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("rdmaflow", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    checks = 0
    n = 1 + 13 * world  # not a multiple of the world
    for dtype in FLOATS + INTS:
        for name, op in OPS.items():
            a = inputs(rank, n, dtype, name)
            dist.all_reduce(a_r := a.clone(), op=op)
            b = on_gloo(dist.all_reduce, a, op=op, group=gloo)
            a = a_r
            same(a, b, dtype, f"all_reduce {dtype} {name}")
            checks += 1
        # avg: Gloo has none; the sum over the world is the reference.
        if dtype.is_floating_point:
            a = inputs(rank, n, dtype, "sum")
            b = on_gloo(dist.all_reduce, a.clone(), group=gloo)
            dist.all_reduce(a, op=dist.ReduceOp.AVG)
            same(a, b / world, dtype, f"all_reduce {dtype} avg")
            checks += 1
        # A tensor that is not contiguous, reduced in place.
        a = inputs(rank, 6 * world, dtype, "sum").reshape(world, 6).t()
        b = on_gloo(dist.all_reduce, a.clone(), group=gloo)
        dist.all_reduce(a)
        same(a, b, dtype, f"all_reduce {dtype} non-contiguous")
        for root in sorted({0, world - 1}):
            a = inputs(rank, n, dtype, "sum", salt=root + 1)
            b = on_gloo(dist.broadcast, a.clone(), root, group=gloo)
            dist.broadcast(a, root)
            same(a, b, dtype, f"broadcast {dtype} root {root}")
            a = inputs(rank, n, dtype, "sum", salt=root + 7)
            b = on_gloo(dist.reduce, a.clone(), root, op=dist.ReduceOp.MAX, group=gloo)
            dist.reduce(a, root, op=dist.ReduceOp.MAX)
            if rank == root:
                same(a, b, dtype, f"reduce {dtype} root {root}")
            checks += 2
        x = inputs(rank, 7, dtype, "sum", salt=3)
        outs_r = [torch.zeros(7, dtype=dtype) for _ in range(world)]
        outs_g = [gloo_dtype(torch.zeros(7, dtype=dtype)) for _ in range(world)]
        dist.all_gather(outs_r, x)
        dist.all_gather(outs_g, gloo_dtype(x), group=gloo)
        outs_g = [o.to(dtype) for o in outs_g]
        same(torch.cat(outs_r), torch.cat(outs_g), dtype, f"all_gather {dtype}")
        flat = torch.zeros(7 * world, dtype=dtype)
        dist._all_gather_base(flat, x)
        same(flat, torch.cat(outs_g), dtype, f"_all_gather_base {dtype}")
        checks += 2
        if dtype not in (torch.uint8, torch.int8):  # Gloo has no reduce_scatter: sums sliced
            ins = [inputs(rank, 5, dtype, "sum", salt=10 + r) for r in range(world)]
            full = torch.cat(ins)
            ref = on_gloo(dist.all_reduce, full.clone(), group=gloo)
            out = torch.zeros(5, dtype=dtype)
            dist.reduce_scatter(out, ins)
            same(out, ref[5 * rank:5 * rank + 5], dtype, f"reduce_scatter {dtype}")
            out2 = torch.zeros(5, dtype=dtype)
            dist._reduce_scatter_base(out2, full)
            same(out2, ref[5 * rank:5 * rank + 5], dtype, f"_reduce_scatter_base {dtype}")
            checks += 2
        src = inputs(rank, 3 * world, dtype, "sum", salt=20)
        out_r = torch.zeros(3 * world, dtype=dtype)
        out_g = gloo_dtype(torch.zeros(3 * world, dtype=dtype))
        dist.all_to_all_single(out_r, src)
        dist.all_to_all_single(out_g, gloo_dtype(src), group=gloo)
        out_g = out_g.to(dtype)
        same(out_r, out_g, dtype, f"all_to_all_single {dtype}")
        checks += 1 + layout_ops(rank, world, dtype, gloo)
    # bool tensors move (broadcast, all_gather) but are not reduced.
    flags = torch.tensor([rank % 2 == 0, True, False, rank == 0])
    dist.broadcast(flags, 0)
    assert flags.tolist() == [True, True, False, True], flags
    got = [torch.zeros(4, dtype=torch.bool) for _ in range(world)]
    dist.all_gather(got, torch.tensor([rank % 2 == 1] * 4))
    assert [g.tolist() for g in got] == [[r % 2 == 1] * 4 for r in range(world)], got
    checks += 2
    # Coalesced: several tensors of one dtype in one call.
    ts = [inputs(rank, k, torch.float32, "sum", salt=30 + k) for k in (1, 17, 300)]
    refs = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    for t in refs:
        dist.all_reduce(t, group=gloo)
    for t, r in zip(ts, refs):
        same(t, r, torch.float32, "all_reduce_coalesced")
    checks += 1
    # Asynchronous works complete, their futures carry the result.
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    assert work.is_completed()
    assert torch.equal(fut.wait()[0], torch.full((1000,), float(world))), "future result"
    checks += 1
    dist.barrier()
    # Bad arguments raise what torch users expect, not a crash.
    bad_calls = [
        ("int16", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), TypeError),
        ("bool sum", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)), TypeError),
        ("BAND", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), ValueError),
        ("root", lambda: dist.broadcast(torch.ones(2), world + 3), (ValueError, RuntimeError)),
    ]
    for what, bad, exc in bad_calls:
        try:
            bad()
        except exc:
            checks += 1
        else:
            raise AssertionError(f"a bad call ({what}) did not raise")
    checks += errors_across_ranks(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: ok ({checks} checks)", flush=True)


if __name__ == "__main__":
    main()
