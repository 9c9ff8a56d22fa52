"""torch.distributed's "rdmaflow" backend.

Importing this module registers the backend, so that

    import rdmaflow.torch
    torch.distributed.init_process_group("rdmaflow", init_method="env://")

runs a job's collectives on rdmaflow, under torchrun or mpirun, with the
store, rank, world size and timeout torch hands every backend. Each pair of
ranks takes the transport rdmaflow picks for it (RDMAFLOW_TRANSPORT, default
auto: shared memory on one host, RDMA or TCP between hosts).

Beside the backend:

    t = rdmaflow.torch.empty(1 << 20)        # a CPU tensor in registered memory
    rdmaflow.torch.stats()                    # the group's transfer counters
    work = rdmaflow.torch.allreduce_compressed(grad, codec="fp16", state=s)
    ddp.register_comm_hook(rdmaflow.torch.hooks.CompressionState(), rdmaflow.torch.hooks.fp16_hook)

See docs/pytorch.md and docs/compression.md.
"""
import datetime

import torch
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
CodecState = _C.CodecState


def group_of(group=None):
    """The rdmaflow process group `group` (default: the default group)."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupRdmaflow):
        raise ValueError(f"rdmaflow: {type(pg).__name__} is not an rdmaflow process group "
                         "(init_process_group(\"rdmaflow\") or new_group(backend=\"rdmaflow\"))")
    return pg


def _sizes(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return [int(s) for s in size]


def empty(*size, dtype=torch.float32, group=None):
    """A CPU tensor whose memory the group's transports have registered: the
    group's collectives send from it without a staging copy. Its contents are
    zero (fresh pages). It may outlive the group: it then stays a usable
    tensor in ordinary memory (docs/pytorch.md, "Registered tensors")."""
    return group_of(group)._empty(_sizes(size), dtype)


def zeros(*size, dtype=torch.float32, group=None):
    """empty(), spelled as torch spells a zero-filled tensor (they are the same)."""
    return empty(*size, dtype=dtype, group=group)


def stats(group=None):
    """The group's transfer counters: pieces sent by the direct path and as
    channel writes, large sends copied into staging and sent straight from
    registered tensors, registered tensors alive."""
    return group_of(group).stats()


def allreduce_compressed(tensor, codec, state=None, group=None, average=True):
    """Starts an allreduce of the float32 `tensor` (in place; the mean when
    `average`, else the sum) whose pieces cross encoded by `codec` ("fp16",
    "bf16", "topk:0.01", "onebit", "qsgd:127": docs/compression.md), with the
    error feedback of `state` (a CodecState: one per tensor, yours, never in
    two calls at once). Returns torch.futures.Future[torch.Tensor] of `tensor`.
    A bad codec raises ValueError."""
    if state is None:
        state = CodecState()
    work = group_of(group)._allreduce_compressed(tensor, codec, state, average)
    return work.get_future().then(lambda fut: fut.value()[0])


from rdmaflow.torch import hooks  # noqa: E402  (after the names it uses)

__all__ = ["BACKEND", "ProcessGroupRdmaflow", "CodecState", "empty", "zeros", "stats",
           "allreduce_compressed", "hooks", "group_of"]
