"""The lighthouse's gate: the only way into a leader's lighthouse from outside its node.

torchft's lighthouse has no authentication: whoever reaches its port can join a
quorum as a replica of its choosing (and make the real ranks dial a store address
of its choosing) or ``POST /replica/<id>/kill`` a rank. So the lighthouse listens on
loopback only, and the leader's daemon listens on the published address
(``node.lighthouse_port``) with this gate in front of it:

1. the gate sends :data:`MAGIC` and a fresh 32-byte nonce;
2. the client answers HMAC-SHA256(job secret, MAGIC + nonce) within
   :data:`HANDSHAKE_TIMEOUT_S`; the job's secret is 32 random bytes in etcd
   (``daemon.coordination.job_secret``), so only a holder of the job's etcd
   credentials can answer;
3. the client's first bytes must be the HTTP/2 connection preface: torchft's
   clients speak gRPC (HTTP/2); the dashboard and its kill route are what HTTP/1.1
   clients (browsers, curl) reach, and they are refused;
4. then bytes are relayed to the loopback lighthouse, both ways, by the gate's relay
   (``daemon.relay``: one thread for every admitted connection).

Each node's forwarder (:class:`daemon.leadership.lighthouse.Forwarder`, the ranks'
``TORCHFT_LIGHTHOUSE``) answers step 2 on their behalf. One asyncio thread serves
every connection until it is admitted (``daemon.listener``; at most
:data:`MAX_CONNECTIONS`), and one relay thread every admitted one, so no flood of
connections or silent clients costs threads. docs/operations.md, "Who can do what from where",
has the threat model.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import time

from daemon.listener import RawListener, bind
from daemon.relay import Relay
from trainer import logs

MAGIC = b"PHALANX-LIGHTHOUSE-GATE/1\n"
NONCE_BYTES = 32
PROOF_BYTES = 32
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HANDSHAKE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256
LOG_EVERY_S = 60.0  # a refused client's warning, at most


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, MAGIC + nonce, hashlib.sha256).digest()


def answer(sock: socket.socket, secret: bytes) -> None:
    """The client's side of the handshake on a connected socket; OSError if it fails."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    challenge = recv_exactly(sock, len(MAGIC) + NONCE_BYTES)
    if not challenge.startswith(MAGIC):
        raise OSError("the lighthouse's address is not a Phalanx gate")
    sock.sendall(proof(secret, challenge[len(MAGIC) :]))
    sock.settimeout(None)


def alive(host: str, port: int, secret: bytes, timeout_s: float) -> bool:
    """Whether a gate answers at (host, port) within `timeout_s`: its daemon sends the
    nonce (a dead, frozen or cut-off one does not; a kernel alone would accept the
    connection) and takes our proof, and gRPC's preface, so the probe is no refusal in its log."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            challenge = recv_exactly(sock, len(MAGIC) + NONCE_BYTES)
            if not challenge.startswith(MAGIC):
                return False
            sock.sendall(proof(secret, challenge[len(MAGIC) :]) + H2_PREFACE)
            return True
    except OSError:
        return False


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from a socket in blocking or timeout mode; OSError if it closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("the connection closed during the handshake")
        data += chunk
    return data


class _Closed(Exception):
    """The client closed the connection; `partial` is what it sent of the awaited bytes."""

    def __init__(self, partial: bytes) -> None:
        super().__init__("closed")
        self.partial = partial


class Gate:
    """Listens on (host, port) and relays authenticated gRPC connections to the lighthouse
    on 127.0.0.1:upstream_port. Raises OSError from the constructor if the port is taken."""

    def __init__(self, host: str, port: int, upstream_port: int, secret: bytes) -> None:
        self.relay = Relay("lighthouse-relay")
        self.listener = RawListener(bind(host, port), self._connection, "lighthouse-gate").start()
        self.port: int = self.listener.port
        self.upstream_port = upstream_port
        self.secret = secret
        self.refused = 0
        self.closing = False
        self._said: dict[object, float] = {}  # client -> when its refusal was last logged
        self.log = logs.get()

    def close(self) -> None:
        self.closing = True  # the connections it cuts are not refusals
        self.listener.stop()
        self.relay.close()

    async def _connection(self, sock: socket.socket) -> bool:
        """Admit `sock` to the relay (True) or refuse it (False: the listener closes it)."""
        if len(self.listener.open) + self.relay.pairs() > MAX_CONNECTIONS:
            return False
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):  # no task of its own, as wait_for
                why = await self._handshake(sock)
        except (_Closed, ConnectionError) as e:
            if not getattr(e, "partial", b""):  # closed without a word: a watcher's probe
                return False  # (daemon.leadership.unreachable), not a refusal
            why = "no answer to the handshake"
        except (TimeoutError, OSError):
            why = "no answer to the handshake"
        if why is not None:
            if not self.closing:
                self._refused(sock, why)
            return False
        loop = asyncio.get_running_loop()
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            await loop.sock_connect(upstream, ("127.0.0.1", self.upstream_port))
        except OSError:
            upstream.close()
            return False
        self.relay.add(sock, upstream, first=H2_PREFACE)
        return True

    def _refused(self, sock: socket.socket, why: str) -> None:
        """Counted; logged once a minute per client, so a flood cannot fill the log."""
        self.refused += 1
        try:
            client: object = sock.getpeername()[0]
        except OSError:
            client = None
        now = time.monotonic()
        if now - self._said.get(client, -LOG_EVERY_S) >= LOG_EVERY_S:
            if len(self._said) > 1024:  # many clients: forget who was said when
                self._said.clear()
            self._said[client] = now
            self.log.warning(
                "lighthouse_gate_refused", client=client, reason=why, refused_total=self.refused
            )

    async def _handshake(self, sock: socket.socket) -> str | None:
        """Why the client may not pass, or None."""
        loop = asyncio.get_running_loop()
        nonce = os.urandom(NONCE_BYTES)
        await loop.sock_sendall(sock, MAGIC + nonce)
        answered = await _read_exactly(loop, sock, PROOF_BYTES)
        if not hmac.compare_digest(answered, proof(self.secret, nonce)):
            return "a wrong answer to the handshake (not a node of this job)"
        preface = await _read_exactly(loop, sock, len(H2_PREFACE))
        if preface != H2_PREFACE:
            return "not gRPC (HTTP/2): the lighthouse's HTTP routes are not served through the gate"
        return None


async def _read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes, and not one more (what follows is the relay's); _Closed if the
    client closes first."""
    data = b""
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise _Closed(data)
        data += chunk
    return data
