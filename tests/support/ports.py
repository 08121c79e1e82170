"""Ports for the programs the tests start, taken from below the kernel's ephemeral range.

A port the kernel hands out for ``bind(0)`` is free only until the next ephemeral pick: an
embedded etcd choosing its own ports, or any outgoing connection's source port, can take it
before the daemon binds it, and a daemon whose lighthouse port is taken cannot lead. Ports
below ``ip_local_port_range`` are never picked by the kernel, and this session hands out each
one once (until it has handed out ``SPAN``), so nothing but another program told that number
can hold it. Where the range starts below ``LOWEST + 1000`` the two overlap, as before.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import subprocess
import time
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12000  # ports this session may hand out, ending just below the ephemeral range
LOWEST = 10000


def _first_ephemeral() -> int:
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _candidates() -> itertools.cycle[int]:
    top = max(_first_ephemeral() - 1, LOWEST + 1000)
    bottom = max(LOWEST, top - SPAN)
    ports = list(range(bottom, top))
    start = random.Random(os.getpid()).randrange(len(ports))  # two sessions rarely overlap
    return itertools.cycle(ports[start:] + ports[:start])


_NEXT = _candidates()


def bindable(port: int) -> bool:
    """Nothing holds ``port`` on any local address (TIME_WAIT counts as held)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port below the ephemeral range that is free now and not handed out before in this session."""
    for port in _NEXT:
        if bindable(port):
            return port
    raise AssertionError("unreachable: the cycle never ends")


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until something accepts on 127.0.0.1:`port`; fails if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None, f"pid {proc.pid} exited before it listened on {port}"
        assert time.monotonic() < deadline, f"nothing listened on {port} within {timeout:g} s"
        time.sleep(0.02)
