"""The daemon's HTTP server speaks plain HTTP/1.1 and closes what it will not serve.

A real server on a loopback port, in-process, with a node view in place of a
supervisor (the routes read only the view); the flood behaviour is tested against a
real daemon in tests/integration/test_http_flood.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.surfaces import server as server_module
from daemon.surfaces.server import StatusServer


@pytest.fixture
def served() -> Iterator[StatusServer]:
    status = NodeStatus.of(NodeView(), "n", "j", 1, shared_fault=False)
    server = StatusServer(lambda: status, "127.0.0.1", 0, lambda: b"phalanx_up 1\n").start()
    try:
        yield server
    finally:
        server.stop()


def exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_get_head_and_refusals(served: StatusServer) -> None:
    got = exchange(served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\nphalanx_up 1\n")
    assert b"Content-Length: 13\r\n" in got and b"Connection: close\r\n" in got
    head = exchange(served.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(
        b"Content-Length: 3\r\nConnection: close\r\n\r\n"
    )
    assert exchange(served.port, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert exchange(served.port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert exchange(served.port, b"GET /nope HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")


def test_an_oversized_or_silent_request_is_closed_unanswered(
    served: StatusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (2 * server_module.MAX_HEAD_BYTES) + b"\r\n\r\n"
    assert exchange(served.port, huge) == b""
    monkeypatch.setattr(server_module, "HEAD_TIMEOUT_S", 0.2)
    assert exchange(served.port, b"GET /healthz HTTP/1.1\r\n") == b""  # never finished


def test_at_the_cap_the_oldest_idle_connection_makes_room(
    served: StatusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 4)
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(4)]
    try:
        assert exchange(served.port, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        assert idle[0].recv(1) == b""  # the oldest idle one was closed for it
    finally:
        for s in idle:
            s.close()
