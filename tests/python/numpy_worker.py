"""One rank of the NumPy API test (rdmaflow.Communicator): rank and world
from RDMAFLOW_RANK / RDMAFLOW_WORLD_SIZE, the rendezvous from
RDMAFLOW_RENDEZVOUS, as any rdmaflow job."""
import numpy as np

import rdmaflow


def main():
    comm = rdmaflow.Communicator()
    r, n = comm.rank, comm.size
    a = np.arange(10, dtype=np.float32) + r
    comm.allreduce(a)
    assert np.array_equal(a, n * np.arange(10, dtype=np.float32) + n * (n - 1) / 2), a
    m = np.array([r, -r, 7], dtype=np.int64)
    comm.allreduce(m, op="max")
    assert m.tolist() == [n - 1, 0, 7], m
    b = np.full(5, r, dtype=np.float64)
    comm.broadcast(b, root=n - 1)
    assert (b == n - 1).all(), b
    g = comm.allgather(np.array([[r, r + 1]], dtype=np.int32))
    assert g.shape == (n, 1, 2) and g[:, 0, 0].tolist() == list(range(n)), g
    rs = comm.reduce_scatter(np.ones((n, 3), dtype=np.float32))
    assert rs.tolist() == [float(n)] * 3, rs
    comm.barrier()
    for bad, exc in ((lambda: comm.allreduce(np.ones(3, dtype=np.complex64)), TypeError),
                     (lambda: comm.allreduce(np.ones((4, 4))[:, 1]), ValueError),
                     (lambda: comm.allreduce(np.ones(3), op="xor"), ValueError)):
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError("a bad call did not raise")
    comm.barrier()
    print(f"rank {r}: ok", flush=True)


if __name__ == "__main__":
    main()
