"""rdmaflow: an RDMA-native tensor transport and collectives runtime.

    import rdmaflow.torch            # registers the torch.distributed backend "rdmaflow"
    torch.distributed.init_process_group("rdmaflow", init_method="env://")

See docs/pytorch.md.
"""

__all__ = ["torch"]
