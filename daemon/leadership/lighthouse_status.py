"""Which members of the lighthouse's last quorum stopped heartbeating: read from its status page.

A group whose host lost power, or was cut off, sends no reset: its peers' collectives
wait for it until ``ft.timeout_s`` (30 s), while the lighthouse knows within
``lighthouse.heartbeat_timeout_ms`` that it stopped heartbeating. torchft 0.2.0 says
so only on its HTML status page (``GET /status``: the previous quorum's members, each
``<b>replica id</b>``, and ``replica id: seen N s ago`` per heartbeat), so the leader
reads that page from the lighthouse's loopback port once a round and announces the
members it lost, with the id of the quorum they were lost from
(``Coordinator.announce_lost``); :class:`StatusPage` keeps one HTTP/1.1 connection open for
those reads (opening one per read through urllib was a third of the leader's loop); every daemon then tells its ranks (``PHALANX_NOTICE``),
and a rank abandons the step that waits on them only while its own quorum is that one:
a replacement that took a lost member's replica id joins a later quorum (its first
quorum is always numbered anew), so a collective with it is never abandoned for the
member it replaced. The page is read, never trusted for anything else: a page that
does not parse names nobody.
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import time
from dataclasses import dataclass

READ_TIMEOUT_S = 0.2  # on loopback; a lighthouse that slow is not read this round

_MEMBER = re.compile(r"<b>\s*([^<\s]+)\s*</b>")
_QUORUM_ID = re.compile(r"Previous quorum id:\s*(\d+)")
_SEEN = re.compile(r"^\s*(\S+): seen ([0-9.eE+-]+)s ago\s*$", re.MULTILINE)


REQUEST = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEAD_MAX = 16384  # bytes of status line and headers: more is not the lighthouse
_LENGTH = re.compile(rb"^content-length:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
_CLOSE = re.compile(rb"^connection:\s*close\s*$", re.IGNORECASE | re.MULTILINE)


class _Unreadable(Exception):
    """An answer that is not a whole HTTP/1.1 page with a length."""


class StatusPage:
    """The status page of the lighthouse on loopback `port`, read over one kept-alive
    connection. The leader reads it every round: the request is fixed bytes and the
    answer is read by its length (torchft's lighthouse sends one), without the standard
    library's client and its header parser, which cost more than the page."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dials = 0  # connections opened so far
        self._sock: socket.socket | None = None

    def read(self) -> str | None:
        """The page, None when the lighthouse does not answer within ``READ_TIMEOUT_S``
        or not with a page. A kept connection the lighthouse has closed since is dialled
        again once."""
        for kept in (self._sock is not None, False):
            deadline = time.monotonic() + READ_TIMEOUT_S
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(
                        ("127.0.0.1", self.port), timeout=READ_TIMEOUT_S
                    )
                    self.dials += 1
                self._sock.settimeout(READ_TIMEOUT_S)
                self._sock.sendall(REQUEST)
                status, page, close = self._answer(self._sock, deadline)
            except _Unreadable:
                self.close()
                return None
            except OSError as e:
                self.close()
                if kept and not isinstance(e, TimeoutError):
                    continue
                return None
            if close:
                self.close()
            return page.decode("utf-8", "replace") if status == 200 else None
        return None

    @staticmethod
    def _answer(sock: socket.socket, deadline: float) -> tuple[int, bytes, bool]:
        """(status code, body, whether the server closes after it); OSError if the
        connection ends or times out first."""
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > HEAD_MAX:
                raise _Unreadable()
            data += _recv(sock, deadline)
        head, body = data[:end], data[end + 4 :]
        parts = head.split(b" ", 2)
        length = _LENGTH.search(head)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise _Unreadable()
        if length is None:
            raise _Unreadable()  # chunked or unbounded: not the lighthouse we know
        size = int(length.group(1))
        while len(body) < size:
            body += _recv(sock, deadline)
        if len(body) > size:
            raise _Unreadable()  # bytes we did not ask for
        return int(parts[1]), body, _CLOSE.search(head) is not None

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def _recv(sock: socket.socket, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the lighthouse's status page took too long")
    sock.settimeout(left)
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionResetError("the lighthouse closed the connection")
    return chunk


def read_status(port: int) -> str | None:
    """The page from the lighthouse on loopback `port` over a connection of its own,
    None when it does not answer."""
    page = StatusPage(port)
    try:
        return page.read()
    finally:
        page.close()


@dataclass(frozen=True)
class Lost:
    """Members of the lighthouse's quorum `quorum_id` that stopped heartbeating."""

    quorum_id: int
    replicas: tuple[str, ...]


def lost_members(page: str, heartbeat_timeout_s: float) -> Lost | None:
    """Members of the previous quorum last seen more than `heartbeat_timeout_s` ago (or not
    at all), sorted, with that quorum's id; None for a page without a previous quorum, one
    that does not parse, or a quorum whose members all heartbeat."""
    start, end = page.find("Previous Quorum"), page.find("Heartbeats")
    if start < 0 or end < start:
        return None
    quorum = _QUORUM_ID.search(page[start:end])
    if quorum is None:
        return None
    members = _MEMBER.findall(page[start:end])
    seen = heard(page)
    lost = sorted({m for m in members if seen.get(m, math.inf) > heartbeat_timeout_s})
    return Lost(int(quorum.group(1)), tuple(lost)) if lost else None


def heard(page: str) -> dict[str, float]:
    """Each replica id on the page's heartbeat list, with seconds since the lighthouse last
    heard it; empty for a page without that list."""
    end = page.find("Heartbeats")
    if end < 0:
        return {}
    seen: dict[str, float] = {}
    for replica, age in _SEEN.findall(page[end:]):
        try:
            seen[replica] = float(age)
        except ValueError:
            continue
    return seen
