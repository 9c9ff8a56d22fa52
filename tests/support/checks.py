"""What the standalone Python test scripts share: a check that records a failure
and goes on (the script reports them all at the end), and a free local port.

A script imports it by its own path (the scripts run from the source tree):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
    from checks import check, failures, free_port
"""
import socket

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
