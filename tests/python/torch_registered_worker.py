"""One rank of the registered-tensor case (rdmaflow.torch.empty): run with
RDMAFLOW_COLL_STAGE=1 over tcp, so that every large send to a peer is
staged unless its source is registered, as on verbs.

    torch_registered_worker.py RANK WORLD PORT

Checks, against Gloo on the same inputs: an all_reduce of a registered
tensor is right and staged nothing; one of an ordinary tensor is right and
was staged. Then the lifetime rule: a registered tensor freed while the
group lives leaves the transports; one alive when the group is destroyed
stays a usable tensor and is freed later without harm.
"""
import datetime
import gc
import sys

import torch
import torch.distributed as dist

import rdmaflow.torch as rt


def delta(before, after, key):
    return after[key] - before[key]


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("rdmaflow", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    n = 1 << 20  # 4 MiB: pieces far above the 4 KiB small sends (always copied)
    data = torch.arange(n, dtype=torch.float32).remainder_(977).add_(rank)

    t = rt.empty(n)
    assert t.dtype == torch.float32 and t.shape == (n,) and t.abs().sum().item() == 0
    assert rt.stats()["registered_buffers"] == 1
    t.copy_(data)
    ref = data.clone()
    dist.all_reduce(ref, group=gloo)
    before = rt.stats()
    dist.all_reduce(t)
    after = rt.stats()
    assert torch.equal(t, ref), f"registered all_reduce differs from gloo: {(t - ref).abs().max()}"
    assert delta(before, after, "staged_pieces") == 0, (before, after)
    assert delta(before, after, "registered_source_pieces") > 0, (before, after)
    print(f"rank {rank}: registered tensor: {delta(before, after, 'registered_source_pieces')} "
          "pieces sent from it, 0 staged", flush=True)

    plain = data.clone()
    before = rt.stats()
    dist.all_reduce(plain)
    after = rt.stats()
    assert torch.equal(plain, ref)
    assert delta(before, after, "staged_pieces") > 0, (before, after)
    assert delta(before, after, "registered_source_pieces") == 0, (before, after)

    # Other dtypes and shapes; broadcast and all_gather read them too.
    h = rt.zeros(3, 1000, dtype=torch.float16)
    h.fill_(rank + 1)
    dist.broadcast(h, src=world - 1)
    assert torch.all(h == world), h
    out = [torch.empty(3, 1000, dtype=torch.float16) for _ in range(world)]
    dist.all_gather(out, h)
    assert all(torch.all(o == world) for o in out)

    # Freed while the group lives: deregistered at once.
    del t, h
    gc.collect()
    assert rt.stats()["registered_buffers"] == 0, rt.stats()

    # Alive when the group goes: it stays a tensor in plain memory.
    keep = rt.empty(4096, dtype=torch.int64)
    keep.fill_(rank)
    dist.all_reduce(keep)
    assert torch.all(keep == world * (world - 1) // 2)
    dist.destroy_process_group()
    gc.collect()
    keep.add_(1)
    assert torch.all(keep == world * (world - 1) // 2 + 1)
    del keep
    gc.collect()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
