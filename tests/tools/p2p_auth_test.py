#!/usr/bin/python3
"""bench/p2p's own sockets (the job handshake's `p2p` label) against strays,
with real processes on 127.0.0.1.

  p2p_auth_test.py P2P_BINARY     (ctest: p2p.stray_connections)

Rank 0 is started by hand (--rank 0 --rendezvous); before the real rank 1
connects, rank 0's port gets three strays: an idle connection that sends
nothing (a port scan, a health check), one that sends garbage, and a p2p rank 1
with a different job secret. The real rank 1 must still run, both ranks must
end well before the handshake timeout an idle stray could cost (it is set to
60 s here: a run that waited for the stray would fail the bound), each stray
must be refused or dropped with its address in rank 0's log, and the rank with
the wrong secret must exit non-zero saying it was refused. Exit 77: p2p is not
built.
"""
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, failures, free_port  # noqa: E402

BOUND_S = 30  # the whole run; an idle stray used to cost up to its handshake timeout (60 s)
def env_with(secret):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMAFLOW_")}
    env.update(RDMAFLOW_JOB_SECRET=secret, RDMAFLOW_AUTH_TIMEOUT_MS="60000",
               RDMAFLOW_TIMEOUT_MS="20000")
    return env


def main():
    p2p = sys.argv[1] if len(sys.argv) > 1 else ""
    if not p2p or not os.access(p2p, os.X_OK):
        print("SKIP: bench/p2p is not built")
        return 77
    port = free_port()
    secret = "p2p-auth-test-secret-" + os.urandom(8).hex()
    common = ["--rendezvous", f"127.0.0.1:{port}", "--transport", "tcp", "--quick", "--no-grpc",
              "--lat-max", "64", "--bw-max", "4K", "--seconds", "0.01", "--link-seconds", "0"]
    t0 = time.monotonic()
    rank0 = subprocess.Popen([p2p, "--rank", "0"] + common, env=env_with(secret), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    strays = []
    try:
        # The idle stray: also the probe for rank 0's listening socket.
        idle = None
        while idle is None and time.monotonic() - t0 < 10:
            try:
                idle = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                time.sleep(0.05)
        if idle is None:
            rank0.kill()
            out, err = rank0.communicate()
            print(f"FAIL: rank 0 never listened on {port}:\n{out}{err}")
            return 1
        strays.append(idle)
        garbage = socket.create_connection(("127.0.0.1", port), timeout=1)
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 200)
        strays.append(garbage)
        stray_addrs = {"idle": "127.0.0.1:%d" % idle.getsockname()[1],
                       "garbage": "127.0.0.1:%d" % garbage.getsockname()[1]}

        wrong = subprocess.run([p2p, "--rank", "1"] + common, env=env_with("another-jobs-secret-1234"),
                               text=True, capture_output=True, timeout=BOUND_S)
        check(wrong.returncode != 0,
              f"the rank with a wrong secret exited {wrong.returncode}:\n{wrong.stdout}{wrong.stderr}")
        check("job secret differs" in wrong.stderr,
              f"the rank with a wrong secret does not say why it was refused:\n{wrong.stderr}")

        real = subprocess.run([p2p, "--rank", "1"] + common, env=env_with(secret), text=True,
                              capture_output=True, timeout=BOUND_S)
        out0, err0 = rank0.communicate(timeout=max(1, BOUND_S - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired as e:
        rank0.kill()
        out0, err0 = rank0.communicate()
        print(f"FAIL: not done within {BOUND_S} s ({e.cmd}): rank 0 said\n{out0}{err0}")
        return 1
    finally:
        for s in strays:
            s.close()
    took = time.monotonic() - t0
    check(rank0.returncode == 0, f"rank 0 exited {rank0.returncode}:\n{out0}{err0}")
    check(real.returncode == 0, f"rank 1 exited {real.returncode}:\n{real.stdout}{real.stderr}")
    check(took < BOUND_S, f"the run took {took:.1f} s (bound {BOUND_S} s)")
    check("tcp" in out0, f"rank 0 printed no tcp results:\n{out0}")
    for what, addr in stray_addrs.items():
        check(addr in err0, f"the {what} stray ({addr}) is not in rank 0's log:\n{err0}")
    refused = [line for line in err0.splitlines() if line.startswith("p2p:")]
    check(len(refused) >= 3, f"rank 0 logged {len(refused)} refused connections, expected 3:\n{err0}")
    print("\n".join(refused))
    print("the rank with a wrong secret:", (wrong.stderr.strip().splitlines() or [""])[-1])
    print(f"p2p with an idle stray, a garbage stray and a wrong secret before the real rank 1: "
          f"{'FAILED' if failures else 'ok'} in {took:.1f} s (handshake timeout 60 s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
