"""rdmaflow: an RDMA-native tensor transport and collectives runtime.

    import rdmaflow.torch            # registers the torch.distributed backend "rdmaflow"
    torch.distributed.init_process_group("rdmaflow", init_method="env://")

or, without torch.distributed, the collectives on NumPy arrays:

    comm = rdmaflow.Communicator()   # under mpirun, srun or RDMAFLOW_RANK/..._WORLD_SIZE
    comm.allreduce(array)            # in place

See docs/pytorch.md.
"""
from rdmaflow._C import Communicator

__all__ = ["Communicator", "torch"]
