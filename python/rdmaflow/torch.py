"""torch.distributed's "rdmaflow" backend.

Importing this module registers the backend, so that

    import rdmaflow.torch
    torch.distributed.init_process_group("rdmaflow", init_method="env://")

runs a job's collectives on rdmaflow, under torchrun or mpirun, with the
store, rank, world size and timeout torch hands every backend. Each pair of
ranks takes the transport rdmaflow picks for it (RDMAFLOW_TRANSPORT, default
auto: shared memory on one host, RDMA or TCP between hosts).
"""
import datetime

import torch.distributed as dist

from rdmaflow import _C

BACKEND = "rdmaflow"


def _create(store, rank, size, timeout):
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    return _C.ProcessGroupRdmaflow(store, rank, size, timeout)


if not hasattr(dist.Backend, BACKEND.upper()):  # registered once per process
    dist.Backend.register_backend(BACKEND, _create)

ProcessGroupRdmaflow = _C.ProcessGroupRdmaflow
__all__ = ["BACKEND", "ProcessGroupRdmaflow"]
