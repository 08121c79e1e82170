"""sd_notify over a real AF_UNIX datagram socket standing in for systemd's."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.supervision.systemd import Notifier

# sun_path holds 108 bytes on Linux; a deep --basetemp could exceed it.
_MAX_SUN_PATH = 100


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _receive_all(sock: socket.socket) -> list[bytes]:
    """Every datagram queued on ``sock`` (sends are synchronous, so all have arrived)."""
    got: list[bytes] = []
    sock.setblocking(False)
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


@pytest.fixture
def sock_dir(tmp_path: Path) -> Iterator[Path]:
    if len(str(tmp_path / "notify.sock").encode()) < _MAX_SUN_PATH:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="phx-sd-") as short:
        yield Path(short)


@pytest.fixture
def systemd_socket(sock_dir: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket like systemd's, and the NOTIFY_SOCKET value naming it."""
    path = sock_dir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield sock, str(path)


def test_ready_status_stopping_send_exact_datagrams(
    systemd_socket: tuple[socket.socket, str],
) -> None:
    sock, address = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled
    notifier.ready()
    notifier.ready("joined quorum as group 2")
    notifier.status("training step 12")
    notifier.stopping()
    notifier.stopping("draining")
    assert _receive_all(sock) == [
        b"READY=1",
        b"READY=1\nSTATUS=joined quorum as group 2",
        b"STATUS=training step 12",
        b"STOPPING=1",
        b"STOPPING=1\nSTATUS=draining",
    ]


def test_status_newlines_cannot_forge_assignments(
    systemd_socket: tuple[socket.socket, str],
) -> None:
    sock, address = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": address})
    notifier.status("rank 3 failed:\nREADY=1\r\nMAINPID=1")
    notifier.ready("a\nb")
    assert _receive_all(sock) == [
        b"STATUS=rank 3 failed: READY=1 MAINPID=1",
        b"READY=1\nSTATUS=a b",
    ]


@pytest.mark.skipif(sys.platform != "linux", reason="abstract sockets are Linux-only")
def test_abstract_namespace_socket() -> None:
    name = f"phalanx-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        notifier.ready("up")
        assert _receive_all(sock) == [b"READY=1\nSTATUS=up"]


def test_watchdog_is_rate_limited_to_half_the_interval(
    systemd_socket: tuple[socket.socket, str],
) -> None:
    sock, address = systemd_socket
    clock = FakeClock()
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier(env, clock=clock)
    assert notifier.watchdog_interval_s == 10.0
    notifier.watchdog()  # first ping is always sent
    clock.now += 1.0
    notifier.watchdog()  # 1 s < 5 s: suppressed
    clock.now += 3.9
    notifier.watchdog()  # 4.9 s since the last ping: suppressed
    assert _receive_all(sock) == [b"WATCHDOG=1"]
    clock.now += 0.1
    notifier.watchdog()  # 5 s: sent
    clock.now += 4.0
    notifier.watchdog()  # suppressed
    clock.now += 1.0
    notifier.watchdog()  # 5 s after the second: sent
    assert _receive_all(sock) == [b"WATCHDOG=1", b"WATCHDOG=1"]


def test_watchdog_silent_without_watchdog_usec(systemd_socket: tuple[socket.socket, str]) -> None:
    sock, address = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.watchdog_interval_s is None
    notifier.watchdog()
    notifier.ready()
    assert _receive_all(sock) == [b"READY=1"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "250000"}, 0.25),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "{pid}"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "{other}"}, None),  # inherited
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "abc"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_parsing(env: dict[str, str], expected: float | None) -> None:
    filled = {
        key: value.format(pid=os.getpid(), other=os.getpid() + 1) for key, value in env.items()
    }
    assert Notifier(filled).watchdog_interval_s == expected


def test_wrong_watchdog_pid_sends_no_pings(systemd_socket: tuple[socket.socket, str]) -> None:
    sock, address = systemd_socket
    env = {
        "NOTIFY_SOCKET": address,
        "WATCHDOG_USEC": "1000000",
        "WATCHDOG_PID": str(os.getpid() + 1),
    }
    Notifier(env).watchdog()
    assert _receive_all(sock) == []


def test_noop_when_notify_socket_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[object] = []
    monkeypatch.setattr(socket.socket, "sendto", lambda *args: sent.append(args))
    for env in ({}, {"NOTIFY_SOCKET": ""}, {"WATCHDOG_USEC": "1000000"}):
        notifier = Notifier(env)
        assert not notifier.enabled
        notifier.ready("x")
        notifier.status("x")
        notifier.watchdog()
        notifier.stopping("x")
    assert sent == []


def test_default_environ_is_os_environ(
    systemd_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, address = systemd_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    Notifier().ready()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not Notifier().enabled
    assert _receive_all(sock) == [b"READY=1"]


def test_dead_socket_is_logged_not_raised(sock_dir: Path) -> None:
    missing = sock_dir / "never-bound.sock"
    stale = sock_dir / "stale.sock"  # bound once, its listener gone: ECONNREFUSED
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(stale))
    env = {"WATCHDOG_USEC": "1000000"}
    for path in (missing, stale):
        notifier = Notifier({"NOTIFY_SOCKET": str(path), **env})
        with capture_logs() as events:
            notifier.ready("up")
            notifier.status("s")
            notifier.watchdog()
            notifier.stopping()
        failures = [e for e in events if e["event"] == "sd_notify_failed"]
        assert [f["message"] for f in failures] == [
            "READY=1 STATUS=up",
            "STATUS=s",
            "WATCHDOG=1",
            "STOPPING=1",
        ]
        assert all(f["notify_socket"] == str(path) for f in failures)


def test_unsupported_address_disables_notifier() -> None:
    with capture_logs() as events:
        notifier = Notifier({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notifier.enabled
    assert [e["event"] for e in events] == ["sd_notify_unsupported_socket"]
