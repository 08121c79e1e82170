"""The sd_notify protocol between a real daemon and a real datagram socket (what systemd does)."""

from __future__ import annotations

import itertools
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.support.harness import start_daemon, wait_for

pytestmark = pytest.mark.integration


class Listener:
    """Receives datagrams on a real AF_UNIX socket in the background, timestamping each."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self.running = True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while self.running:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                continue
            except OSError:  # closed by close()
                return

    def times(self, assignment: str) -> list[float]:
        return [t for t, m in list(self.messages) if assignment in m.split("\n")]

    def close(self) -> None:
        self.running = False
        self.sock.close()


def test_ready_watchdog_and_stopping(tmp_path: Path, etcd_endpoint: str) -> None:
    # AF_UNIX paths are short (108 bytes): bind in a short temporary directory.
    with tempfile.TemporaryDirectory(prefix="sdn-") as short:
        listener = Listener(str(Path(short) / "notify"))
        env = {
            "NOTIFY_SOCKET": str(Path(short) / "notify"),
            "WATCHDOG_USEC": "4000000",  # WatchdogSec=4s
        }
        daemon = start_daemon(
            tmp_path, "sd-node", [etcd_endpoint], overrides=["train.steps=100000"], env=env
        )
        try:
            wait_for(lambda: listener.times("READY=1"), 60, "READY=1")
            # READY comes once the node is registered in etcd (the daemon logs that first).
            assert daemon.events("node_registered"), "READY=1 before registration"
            ready_message = next(m for _, m in listener.messages if "READY=1" in m)
            assert "STATUS=" in ready_message
            wait_for(lambda: daemon.step() > 0, 60, "training to start")
            start = time.monotonic()
            time.sleep(7)
            pings = [t for t in listener.times("WATCHDOG=1") if t >= start]
            assert len(pings) >= 3, f"only {len(pings)} watchdog pings in 7 s"
            gaps = [b - a for a, b in itertools.pairwise(pings)]
            assert max(gaps) < 4.0, f"a watchdog gap of {max(gaps):.2f}s exceeds WatchdogSec"
            assert any(m.startswith("STATUS=running") for _, m in listener.messages)
            daemon.proc.popen.send_signal(signal.SIGTERM)
            wait_for(lambda: listener.times("STOPPING=1"), 30, "STOPPING=1")
            assert daemon.wait(30) == 0
        finally:
            daemon.stop()
            listener.close()
