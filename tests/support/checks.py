"""What the standalone Python test scripts share: a check that records a failure
and goes on (the script reports them all at the end), and a free local port.

A script imports it by its own path (the scripts run from the source tree):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
    from checks import check, failures, free_port
"""
import random
import socket

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def _bind(port):
    """The port a socket bound to 127.0.0.1:port got (0: the kernel's pick), or None."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return s.getsockname()[1]


def free_port():
    """A port free a moment ago, from below the kernel's ephemeral range, as
    tools/free_port.h picks one: connect() takes the local port of every
    outgoing connection from that range, so a port of it released here may
    be the next one a test beside this one takes."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    if high - 10000 >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = _bind(rng.randint(10000, high))
            if port:
                return port
    return _bind(0)
