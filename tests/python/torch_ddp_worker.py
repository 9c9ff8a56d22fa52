"""One rank of the DDP case: a model trained for a few steps with
DistributedDataParallel on BACKEND, printing each step's loss, so that the
test can compare rdmaflow's run with Gloo's (same seed, same data).

    torch_ddp_worker.py RANK WORLD PORT BACKEND MODEL STEPS [CODEC]

With CODEC (rdmaflow only), the gradients cross through that codec's DDP
communication hook (rdmaflow.torch.hooks.codec_hook).
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rdmaflow.torch  # noqa: F401


def model_and_batch(name, rank):
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of data
    if name == "mlp":
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10))
        x = torch.randn(32, 64, generator=g)
    else:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
        x = torch.randn(4, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    return model, x, y


def main():
    rank, world, port, backend, name, steps = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                               sys.argv[4], sys.argv[5], int(sys.argv[6]))
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's too)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    model, x, y = model_and_batch(name, rank)
    ddp = DDP(model, bucket_cap_mb=1)  # several buckets: overlapping allreduces
    if len(sys.argv) > 7:
        from rdmaflow.torch import hooks
        state = hooks.CompressionState()
        ddp.register_comm_hook(state, hooks.codec_hook(sys.argv[7]))
    # SGD at 0.05 with momentum 0.9 unless TORCH_DDP_LR, TORCH_DDP_MOMENTUM say otherwise.
    momentum = float(os.environ.get("TORCH_DDP_MOMENTUM", "0.9"))
    lr = float(os.environ.get("TORCH_DDP_LR", "0.05"))
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        # The mean loss over ranks: what both backends must agree on.
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        print(f"step {step} loss {mean.item() / world:.8f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
