"""One rank of the job-secret case: the ranks are given different job secrets
(RDMAFLOW_JOB_SECRET), so setting up the group's channels must fail on every
rank, within the group's timeout, with an error a torch user can act on.

    torch_secret_worker.py RANK WORLD PORT TIMEOUT_S
Exits 3 after printing "refused: <error>", 0 if the group worked (a failure
of the test).
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist

import rdmaflow.torch  # noqa: F401


def main():
    rank, world, port, timeout = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                  float(sys.argv[4]))
    start = time.monotonic()
    try:
        dist.init_process_group("rdmaflow", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout))
        t = torch.ones(1024)
        dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - start
        print(f"refused after {took:.1f} s: {e}", flush=True)
        sys.exit(3)
    print(f"rank {rank}: the group worked with another rank's job secret", flush=True)


if __name__ == "__main__":
    main()
