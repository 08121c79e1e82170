"""A TCP listener served by one asyncio thread: what the daemon's network surfaces share.

The HTTP server (``daemon.surfaces.server``) and the lighthouse's gate
(``daemon.leadership.gate``) face clients the daemon does not control. With a thread
per connection, a flood of idle connections became a thousand threads whose wake-up
starved the supervisor loop; here every connection is a coroutine on one thread, so
an idle client costs a socket and nothing else. The socket is bound by the caller
(so a taken port is the caller's error, at once); :class:`Listener` serves it until
:meth:`Listener.stop`, then closes every connection still open.

:class:`RawListener` is the same thread and limits for a handler that wants the
socket itself rather than streams (the gate hands an admitted connection's socket to
a relay, ``daemon.relay``, and streams would have read past where it hands over).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Self

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
# Given a connection's non-blocking socket; True if it kept the socket (the listener
# then neither tracks nor closes it), False to have it closed.
RawHandler = Callable[[socket.socket], Awaitable[bool]]


def bind(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on (host, port), IPv6 for an address with a colon, with
    SO_REUSEADDR (closed connections of an earlier listener may linger on the port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class _Served:
    """A listening socket served by an asyncio loop in thread `name`, until :meth:`stop`."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(5)
        self.sock.close()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self._serve(self._loop, self._stopping)

    async def _serve(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
        raise NotImplementedError


class Listener(_Served):
    """Serve `sock` with `handle` (one coroutine per connection) in thread `name`."""

    def __init__(self, sock: socket.socket, handle: Handler, name: str, limit: int = 65536) -> None:
        super().__init__(sock, name)
        self.handle = handle
        self.limit = limit
        self.writers: set[asyncio.StreamWriter] = set()  # the connections open now

    async def _serve(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
        server = await asyncio.start_server(self._tracked, sock=self.sock, limit=self.limit)
        self._ready.set()
        async with server:
            await stopping.wait()
        for writer in list(self.writers):  # stopped: every connection ends now
            writer.close()
        await asyncio.sleep(0)  # let the transports close their sockets

    async def _tracked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            await self.handle(reader, writer)
        finally:
            self.writers.discard(writer)
            writer.close()


class RawListener(_Served):
    """Serve `sock` with `handle` (one coroutine per connection, on its raw socket) in
    thread `name`."""

    def __init__(self, sock: socket.socket, handle: RawHandler, name: str) -> None:
        super().__init__(sock, name)
        self.handle = handle
        self.open: set[socket.socket] = set()  # connections its handler has not kept
        self._tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._accept)
        self._ready.set()
        await stopping.wait()
        loop.remove_reader(self.sock.fileno())
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self.open):  # stopped: every connection not handed on ends now
            conn.close()

    def _accept(self) -> None:
        """Every connection waiting, from the loop's callback: a client that is gone
        before it sent a byte (a probe of whether the host answers, four a second per
        watcher) is closed here, without a coroutine of its own."""
        assert self._loop is not None
        for _ in range(64):  # then the loop's other work gets its turn
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionError:  # reset before we took it
                continue
            except OSError:  # out of descriptors: wait a little rather than spin on it
                self._loop.remove_reader(self.sock.fileno())
                self._loop.call_later(0.1, self._loop.add_reader, self.sock.fileno(), self._accept)
                return
            conn.setblocking(False)
            if _gone(conn):
                conn.close()
                continue
            self.open.add(conn)
            task = self._loop.create_task(self._tracked(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _tracked(self, conn: socket.socket) -> None:
        kept = False
        try:
            kept = await self.handle(conn)
        finally:
            self.open.discard(conn)
            if not kept:
                conn.close()


def _gone(conn: socket.socket) -> bool:
    """Whether the client closed the connection without sending anything."""
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
