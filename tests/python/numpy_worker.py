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
    t = comm.alltoall(np.arange(n * 2, dtype=np.int32).reshape(n, 2) + 100 * r)
    assert t.tolist() == [[2 * r + 100 * p, 2 * r + 1 + 100 * p] for p in range(n)], t
    # Uneven: rank r sends p + r + 1 elements (value 1000 r + p) to rank p,
    # none to itself when r is 0.
    counts = [0 if (r == 0 and p == 0) else p + r + 1 for p in range(n)]
    send = np.concatenate([np.full(c, 1000 * r + p, dtype=np.float64) for p, c in enumerate(counts)])
    expect = [0 if (p == 0 and r == 0) else r + p + 1 for p in range(n)]
    for v in (comm.alltoallv(send, counts), comm.alltoallv(send, counts, expect)):
        want = np.concatenate([np.full(c, 1000 * p + r, dtype=np.float64)
                               for p, c in enumerate(expect)])
        assert np.array_equal(v, want), (v, want)
    if n > 1:  # a ring of send/recv, tags checked
        right, left = (r + 1) % n, (r - 1) % n
        msg = np.full(600000, r, dtype=np.float32)  # 2.4 MB: more than a lane's slots
        got = np.empty_like(msg)
        if r % 2 == 0:
            comm.send(msg, right, tag=5)
            comm.recv(got, left, tag=5)
        else:
            comm.recv(got, left, tag=5)
            comm.send(msg, right, tag=5)
        assert (got == left).all(), got[:4]
        comm.send(np.ones(2, dtype=np.int64), right, tag=1)
        try:
            comm.recv(np.empty(2, dtype=np.int64), left, tag=2)
        except RuntimeError as e:
            assert "tag" in str(e), e
        else:
            raise AssertionError("a recv of the wrong tag did not raise")
    comm.barrier()
    for bad, exc in ((lambda: comm.allreduce(np.ones(3, dtype=np.complex64)), TypeError),
                     (lambda: comm.allreduce(np.ones((4, 4))[:, 1]), ValueError),
                     (lambda: comm.allreduce(np.ones(3), op="xor"), ValueError),
                     (lambda: comm.alltoallv(np.ones(3), [1] * (n + 1)), ValueError),
                     (lambda: comm.alltoallv(np.ones(3), [-1] + [0] * (n - 1)), ValueError),
                     (lambda: comm.alltoallv(np.ones(3), [4] * n), ValueError),
                     (lambda: comm.send(np.ones(3), n), ValueError),
                     (lambda: comm.recv(np.ones(3), r), ValueError)):
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
