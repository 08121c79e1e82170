"""Byte relays between pairs of connected sockets, all served by one thread.

The lighthouse's traffic crosses two relays on its way from a rank to the lighthouse:
the rank's node forwarder (``daemon.leadership.lighthouse.Forwarder``) and the
leader's gate (``daemon.leadership.gate``). torchft's managers heartbeat every 0.1 s,
so each relay wakes tens of times a second for a few bytes. Relayed by asyncio
streams, the gate cost the leader's daemon about 0.27 ms of CPU per wake-up (1.4 of
the machine's 200 CPU ticks a second with two groups); by a thread per direction, the
forwarder cost a quarter of that, but two threads per connection. Here one thread
waits on every relayed socket with epoll and copies what arrives straight to the
other side: about what the threads cost per wake-up, with no thread per connection.

A pair ends when either side closes or fails: both sockets are closed, as a relay by
two threads did. The sockets belong to the relay once added; to end a pair from
another thread, :meth:`Relay.cut` shuts a socket down (the relay thread sees its end
and closes both). A slow reader is never waited on: what it cannot take yet is kept,
and its partner is not read again until that has gone.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

CHUNK = 65536
_READ = select.EPOLLIN | select.EPOLLRDHUP


class Relay:
    """Copies bytes both ways between each added pair of sockets, from thread `name`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._epoll = select.epoll()
        self._socks: dict[int, socket.socket] = {}
        self._peer: dict[int, int] = {}  # fd -> the fd its bytes go to
        self._unsent: dict[int, bytes] = {}  # fd -> bytes waiting to be written to it
        self._mask: dict[int, int] = {}  # fd -> the events epoll waits for on it now
        self._ended: set[int] = set()  # fds of pairs ended while handling this poll's events
        self._lock = threading.Lock()  # add and cut against the thread's closing
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, a: socket.socket, b: socket.socket, first: bytes = b"") -> None:
        """Relay between `a` and `b` from now on, `first` written to `b` before anything
        else; the relay owns both. On a closed relay both are closed at once."""
        with self._lock:
            if self._closed:
                close_socket(a)
                close_socket(b)
                return
            for s in (a, b):
                s.setblocking(False)
                self._socks[s.fileno()] = s
                self._mask[s.fileno()] = 0
                self._epoll.register(s.fileno(), 0)
            self._peer[a.fileno()], self._peer[b.fileno()] = b.fileno(), a.fileno()
            if first:
                self._unsent[b.fileno()] = first
            self._arm(a.fileno())
            self._arm(b.fileno())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()

    def pairs(self) -> int:
        """How many pairs are being relayed now."""
        return len(self._socks) // 2

    def cut(self, sock: socket.socket) -> None:
        """End `sock`'s pair soon (the relay thread closes both); safe from any thread."""
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cut_all(self) -> None:
        with self._lock:
            socks = list(self._socks.values())
        for s in socks:
            self.cut(s)

    def close(self) -> None:
        """Cut every pair and take no more; the thread ends once they are closed."""
        with self._lock:
            self._closed = True
        self.cut_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed and not self._socks:
                    self._epoll.close()
                    self._thread = None
                    return
            try:
                events = self._epoll.poll(1.0)  # the timeout only notices close()
            except InterruptedError:
                continue
            self._ended = set()
            for fd, mask in events:
                # A pair ended earlier in this batch: its fd may already be a new pair's,
                # and this event was the old socket's.
                if fd in self._socks and fd not in self._ended:
                    self._event(fd, mask)

    def _event(self, fd: int, mask: int) -> None:
        if mask & (select.EPOLLHUP | select.EPOLLERR):  # both ways gone: nothing to finish
            self._end(fd)
            return
        peer = self._peer[fd]
        if mask & select.EPOLLOUT and not self._write(fd):
            return
        if mask & _READ and peer not in self._unsent:
            try:
                data = self._socks[fd].recv(CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._end(fd)
                return
            self._unsent[peer] = data
            if not self._write(peer):
                return
        self._arm(fd)
        self._arm(peer)

    def _write(self, fd: int) -> bool:
        """Write what waits for `fd`, keeping what it cannot take yet; False if the pair ended."""
        data = self._unsent.pop(fd, b"")
        try:
            sent = self._socks[fd].send(data) if data else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._end(fd)
            return False
        if sent < len(data):
            self._unsent[fd] = data[sent:]
        return True

    def _arm(self, fd: int) -> None:
        """Wait to read `fd` only while nothing it sent waits for its partner, and to
        write to it while something waits for it."""
        mask = 0 if self._peer[fd] in self._unsent else _READ
        if fd in self._unsent:
            mask |= select.EPOLLOUT
        if mask != self._mask[fd]:
            self._epoll.modify(fd, mask)
            self._mask[fd] = mask

    def _end(self, fd: int) -> None:
        with self._lock:
            for f in (fd, self._peer[fd]):
                self._ended.add(f)
                sock = self._socks.pop(f)
                self._peer.pop(f, None)
                self._unsent.pop(f, None)
                self._mask.pop(f, None)
                with contextlib.suppress(OSError):
                    self._epoll.unregister(f)
                close_socket(sock)


def close_socket(sock: socket.socket) -> None:
    """Shut both ways and close, whatever state the socket is in."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
