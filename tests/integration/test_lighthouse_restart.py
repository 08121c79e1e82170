"""A leader's lighthouse comes back on its own port at once after it was stopped with
clients connected (a fence stops it mid-run): the port's closed connections linger in
the kernel (TIME_WAIT / FIN_WAIT) and must not count as the port being in use."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from daemon.config import LighthouseConfig
from daemon.leadership.gate import answer
from daemon.leadership.lighthouse import LighthouseError, LighthouseProcess
from tests.support.harness import free_port, wait_for

pytestmark = pytest.mark.integration

SECRET = b"s" * 32


def _serving(tmp_path: Path, port: int, name: str) -> LighthouseProcess:
    lh = LighthouseProcess(
        LighthouseConfig(), 1, "127.0.0.1", port, tmp_path / f"{name}.log", SECRET
    )
    lh.start()
    wait_for(lh.listening, 30, f"{name} to listen")
    return lh


def test_a_stopped_lighthouse_restarts_on_its_port_while_its_connections_linger(
    tmp_path: Path,
) -> None:
    port = free_port()
    first = _serving(tmp_path, port, "first")
    clients = []
    try:
        for _ in range(3):  # ranks' heartbeat connections, open when the fence comes
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            answer(c, SECRET)  # through the gate, as a node's forwarder gets in
            clients.append(c)
        time.sleep(0.2)
        first.stop()  # SIGKILL: the kernel closes the server's side first
        for c in clients:
            c.close()
    finally:
        first.stop()
    lingering = _lingering(port)
    assert lingering, "the test needs closed connections still held on the port"
    second = _serving(tmp_path, port, "second")
    try:
        assert second.port == port and second.alive
    finally:
        second.stop()


def test_a_port_held_by_a_listener_is_refused(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        lh = LighthouseProcess(
            LighthouseConfig(), 1, "127.0.0.1", port, tmp_path / "lh.log", SECRET
        )
        with pytest.raises(LighthouseError, match=f"node.lighthouse_port {port}"):
            lh.start()
        assert lh.popen is None


def _lingering(port: int) -> list[str]:
    """Sockets in /proc/net/tcp with local `port` in a closing state (not LISTEN)."""
    closing = {
        "04",
        "05",
        "06",
        "08",
        "09",
        "0B",
    }  # FIN_WAIT1/2, TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return [
        r for r in rows if int(r.split()[1].split(":")[1], 16) == port and r.split()[3] in closing
    ]
