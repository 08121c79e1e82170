"""daemon.relay: one thread copies bytes both ways between pairs of real sockets."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from daemon.relay import Relay

TIMEOUT_S = 10.0


@pytest.fixture
def relay() -> Iterator[Relay]:
    r = Relay("relay-under-test")
    yield r
    r.close()


def pair(relay: Relay, first: bytes = b"") -> tuple[socket.socket, socket.socket]:
    """Two client ends whose far ends the relay joins."""
    a, relayed_a = socket.socketpair()
    relayed_b, b = socket.socketpair()
    relay.add(relayed_a, relayed_b, first)
    for s in (a, b):
        s.settimeout(TIMEOUT_S)
    return a, b


def read_all(sock: socket.socket, n: int, pause_s: float = 0.0) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if pause_s:
            time.sleep(pause_s)  # a slow reader: the relay must hold what it cannot write
    return bytes(data)


def test_bytes_cross_both_ways_at_once_in_order_to_slow_readers(relay: Relay) -> None:
    a, b = pair(relay)
    there, back = os.urandom(3 << 20), os.urandom(3 << 20)  # far more than socket buffers
    got: dict[str, bytes] = {}

    def reader(name: str, sock: socket.socket, n: int) -> None:
        got[name] = read_all(sock, n, pause_s=0.001)

    readers = [
        threading.Thread(target=reader, args=("b", b, len(there))),
        threading.Thread(target=reader, args=("a", a, len(back))),
    ]
    writers = [
        threading.Thread(target=a.sendall, args=(there,)),
        threading.Thread(target=b.sendall, args=(back,)),
    ]
    for t in readers + writers:
        t.start()
    for t in readers + writers:
        t.join(TIMEOUT_S * 3)
    assert got["b"] == there
    assert got["a"] == back


def test_first_bytes_arrive_before_anything_relayed(relay: Relay) -> None:
    a, b = pair(relay, first=b"HELLO ")
    a.sendall(b"world")
    assert read_all(b, len(b"HELLO world")) == b"HELLO world"


def test_either_side_closing_closes_the_other(relay: Relay) -> None:
    a, b = pair(relay)
    c, d = pair(relay)
    a.close()
    d.close()
    assert b.recv(1) == b""
    assert c.recv(1) == b""
    deadline = time.monotonic() + TIMEOUT_S
    while relay.pairs() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert relay.pairs() == 0


def test_a_cut_ends_its_pair_only(relay: Relay) -> None:
    a1, relayed = socket.socketpair()
    relayed_b, b1 = socket.socketpair()
    relay.add(relayed, relayed_b)
    a2, b2 = pair(relay)
    for s in (a1, b1):
        s.settimeout(TIMEOUT_S)
    relay.cut(relayed)
    assert a1.recv(1) == b""
    assert b1.recv(1) == b""
    a2.sendall(b"still here")
    assert read_all(b2, 10) == b"still here"


def test_one_thread_serves_every_pair() -> None:
    relay = Relay("relay-of-twenty")
    ends = [pair(relay) for _ in range(20)]
    for i, (a, _) in enumerate(ends):
        a.sendall(b"%02d" % i)
    assert [read_all(b, 2) for _, b in ends] == [b"%02d" % i for i in range(20)]
    names = [t.name for t in threading.enumerate()]
    relay.close()
    assert names.count("relay-of-twenty") == 1


def test_a_closed_relay_cuts_its_pairs_and_takes_no_more(relay: Relay) -> None:
    a, b = pair(relay)
    relay.close()
    assert a.recv(1) == b""
    assert b.recv(1) == b""
    late_a, late_b = socket.socketpair(), socket.socketpair()
    relay.add(late_a[1], late_b[0])
    assert late_a[1].fileno() == -1 and late_b[0].fileno() == -1
