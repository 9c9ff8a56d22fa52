"""One rank of the dead-rank case: the last rank dies before the second
allreduce; every survivor's wait() must raise within the group's timeout,
naming the rank and the operation.

    torch_dead_rank_worker.py RANK WORLD PORT TIMEOUT_S
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import rdmaflow.torch  # noqa: F401


def main():
    rank, world, port, timeout = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                  float(sys.argv[4]))
    dist.init_process_group("rdmaflow", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank == world - 1:
        os._exit(0)  # dies without a goodbye
    time.sleep(0.2)
    start = time.monotonic()
    # A recv from the dead rank, pending while the allreduce fails.
    pending = dist.irecv(torch.zeros(4), src=world - 1)
    # The recv first: it must see the death itself, not a broken communicator.
    for what, call in [("recv", pending.wait),
                       ("allreduce", lambda: dist.all_reduce(t)),
                       ("gather", lambda: dist.gather(t, [t] * world if rank == 0 else None)),
                       ("alltoall", lambda: dist.all_to_all_single(torch.zeros(world),
                                                                   torch.ones(world)))]:
        try:
            call()
        except RuntimeError as e:
            took = time.monotonic() - start
            text = str(e)
            assert what in text, text
            assert f"rank {world - 1}" in text or "peer" in text, text
            assert took < timeout + 10, f"raised after {took:.1f} s, timeout {timeout} s"
            print(f"rank {rank}: {what} raised after {took:.1f} s: {text.splitlines()[0][:200]}",
                  flush=True)
        else:
            raise AssertionError(f"the {what} with a dead rank did not raise")
    os._exit(0)  # the group is broken: leave without tearing it down


if __name__ == "__main__":
    main()
