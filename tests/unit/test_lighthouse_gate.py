"""The lighthouse's gate and the node's forwarder, on real loopback sockets: only a
holder of the job's secret that speaks gRPC's preface is relayed to the lighthouse."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from daemon.leadership.gate import H2_PREFACE, MAGIC, NONCE_BYTES, Gate, answer, recv_exactly
from daemon.leadership.lighthouse import Forwarder

SECRET = b"s" * 32
TIMEOUT_S = 10.0


class Echo:
    """A stand-in for the lighthouse's port: echoes every byte, counts connections."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)


@pytest.fixture
def echo() -> Iterator[Echo]:
    e = Echo()
    yield e
    e.server.close()


@pytest.fixture
def gate(echo: Echo) -> Iterator[Gate]:
    g = Gate("127.0.0.1", 0, echo.port, SECRET)
    yield g
    g.close()


def dial(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.settimeout(TIMEOUT_S)
    return sock


def ended(sock: socket.socket) -> bool:
    """Whether the other side closed (a close with our bytes unread is a reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def wait_for(check: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    assert check(), what  # type: ignore[operator]


def test_a_job_member_speaking_grpc_reaches_the_lighthouse(gate: Gate, echo: Echo) -> None:
    sock = dial(gate.port)
    answer(sock, SECRET)
    payload = H2_PREFACE + b"frames" * 1000
    sock.sendall(payload)  # the preface and what follows it in one write
    assert recv_exactly(sock, len(payload)) == payload  # the gate passed the preface on
    assert gate.refused == 0
    assert gate.relay.pairs() == 1


@pytest.mark.parametrize(
    "secret, after",
    [(b"x" * 32, H2_PREFACE), (SECRET, b"GET /replica/x/kill HTTP/1.1\r\nHost: a\r\n\r\n")],
    ids=["wrong-secret", "http1"],
)
def test_others_are_refused_and_counted(
    gate: Gate, echo: Echo, secret: bytes, after: bytes
) -> None:
    sock = dial(gate.port)
    answer(sock, secret)
    sock.sendall(after)
    assert ended(sock)
    wait_for(lambda: gate.refused == 1, "the refusal is counted")
    assert echo.accepted == 0


def test_a_probe_that_closes_without_a_word_is_no_refusal(gate: Gate, echo: Echo) -> None:
    sock = dial(gate.port)
    assert recv_exactly(sock, len(MAGIC) + NONCE_BYTES).startswith(MAGIC)
    sock.close()
    wait_for(lambda: not gate.listener.open, "the gate closed the probe's connection")
    assert gate.refused == 0
    assert echo.accepted == 0


def test_the_forwarder_answers_for_the_ranks_and_drops_them_on_a_new_target(
    gate: Gate, echo: Echo
) -> None:
    forwarder = Forwarder()
    try:
        forwarder.set_target(f"127.0.0.1:{gate.port}", SECRET)
        rank = dial(forwarder.port)
        payload = H2_PREFACE + b"heartbeat"
        rank.sendall(payload)
        assert recv_exactly(rank, len(payload)) == payload
        forwarder.set_target(None)  # the leader moved: old connections end
        assert rank.recv(1) == b""
        wait_for(lambda: gate.relay.pairs() == 0, "the gate's side ended too")
    finally:
        forwarder.close()


def test_a_client_that_says_nothing_is_refused_at_the_handshake_deadline(
    gate: Gate, echo: Echo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("daemon.leadership.gate.HANDSHAKE_TIMEOUT_S", 0.3)
    sock = dial(gate.port)
    assert recv_exactly(sock, len(MAGIC) + NONCE_BYTES).startswith(MAGIC)
    sock.sendall(b"half an answer")  # and then nothing more
    assert ended(sock)
    wait_for(lambda: gate.refused == 1, "the silent client is refused")
    assert echo.accepted == 0
