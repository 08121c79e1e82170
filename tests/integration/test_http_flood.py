"""A flood of idle connections to a node's HTTP port (the liveness probe's) stops nothing.

1,000 TCP connections are opened to a training node's HTTP port and held idle for
20 s, then closed at once, while the test probes ``/healthz`` as a kubelet would
(one request every 0.25 s, 2 s timeout). Throughout: every probe answers 200, the
ranks keep committing, the daemon never fences or loses its etcd session, and its
thread count stays where it was before the flood.
"""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import pytest

from tests.support.harness import Daemon, start_daemon, wait_for

pytestmark = pytest.mark.integration

CONNECTIONS = 1000
HELD_S = 20.0


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def probe(d: Daemon) -> int:
    try:
        return d.get("/healthz")[0]
    except OSError:
        return 0  # refused or timed out: a failed probe


def open_idle(port: int, n: int) -> list[socket.socket]:
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        held.append(s)
    return held


def test_a_thousand_idle_connections_starve_nothing(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < CONNECTIONS + 200:
        pytest.skip(f"this machine allows {hard} open files, the test needs {CONNECTIONS + 200}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, CONNECTIONS + 200), hard))
    d = start_daemon(tmp_path, "flood", None, overrides=["train.steps=1000000"])
    held: list[socket.socket] = []
    try:
        wait_for(lambda: d.step() >= 5, 120, "training")
        time.sleep(1)  # the daemon's threads settle (standby, keepalive)
        before = threads(d.pid)
        step_before = d.step()
        codes: list[int] = []
        counts: list[int] = []
        held = open_idle(d.http_port, CONNECTIONS)
        flood_started = time.monotonic()
        while time.monotonic() - flood_started < HELD_S:
            codes.append(probe(d))
            counts.append(threads(d.pid))
            time.sleep(0.25)
        step_during = d.step()
        for s in held:
            s.close()
        held = []
        closed = time.monotonic()
        while time.monotonic() - closed < 5:
            codes.append(probe(d))
            counts.append(threads(d.pid))
            time.sleep(0.25)
        assert codes and all(c == 200 for c in codes), codes
        assert step_during > step_before, (step_before, step_during)
        assert d.step() > step_during
        for event in ("fenced", "etcd_session_lost", "group_paused", "group_restarted"):
            assert not d.events(event), d.events(event)
        assert max(counts) <= before + 2, (before, max(counts))
        print(f"threads before {before}, most during the flood {max(counts)}; {len(codes)} probes")
    finally:
        for s in held:
            s.close()
        d.stop()
