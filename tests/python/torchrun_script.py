"""A script as a user writes it: launched by torchrun, which sets every variable
init_process_group("rdmaflow") needs (env://)."""
import torch, torch.distributed as dist
import rdmaflow.torch
dist.init_process_group("rdmaflow")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.tolist() == [sum(range(1, dist.get_world_size() + 1))] * 4, t
print(f"torchrun rank {dist.get_rank()} of {dist.get_world_size()}: ok", flush=True)
dist.destroy_process_group()
