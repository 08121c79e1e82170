"""The node's lease kept alive over one long-lived gRPC ``LeaseKeepAlive`` stream.

pyetcd's ``refresh_lease`` opens a new bidirectional stream for every refresh (a
one-message request iterator). At one refresh a second per daemon that is a stream
set up and torn down every second on etcd, for every node (issue 35). Here:

* :class:`LeaseKeepAlive` keeps ONE stream open on a connection's current pyetcd
  client, with no deadline. Requests come from a queue (gRPC's own sender thread
  drains it), answers are read by one daemon thread (``phalanx-keepalive-stream``)
  onto an answer queue. :meth:`LeaseKeepAlive.refresh` sends one request and waits
  up to ``timeout_s`` for its answer; answers come in order, so one read late still
  confirms the lease as of its own send time. A gRPC error, a stream that etcd
  closed, or a request unanswered for half the TTL tears the stream down (a daemon
  short of CPU reads its answers late: tearing the stream down at every slow answer
  made an overloaded node lose its lease sooner), and the refresh raises through
  ``_Connection.call`` (``translate_error``: :class:`EtcdUnavailable`, or
  :class:`EtcdAccessDenied` for auth and TLS problems), which also discards the
  client after a transient failure. The next refresh opens a new stream, on a fresh
  client where the last one was discarded (an etcd restart, an expired auth token).
* :class:`_Session` is one lease and the daemon thread that refreshes it on that
  stream every ``refresh_every_s(ttl)`` (``daemon.coordination.lease_timing``), and
  retries as often after a failure. It keeps the outcome of its last refresh, which
  :meth:`_Session.confirm` hands to the main loop without a request of its own.

The session counts as lost when etcd says the lease is gone (an answer with TTL <= 0),
or when no refresh succeeded for a whole TTL (etcd must then be assumed to have
expired it, as other nodes see it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]  # no stubs; not in the mypy overrides
from pyetcd import etcdrpc

from daemon.coordination.etcd_client import CoordinationError, EtcdUnavailable, _Connection
from daemon.coordination.lease_timing import refresh_every_s
from trainer import logs

log = logs.get()

READER_JOIN_S = 1.0  # a cancelled stream's reader ends at once; this only bounds a close


class _StreamError(grpc.RpcError):  # type: ignore[misc]  # grpc has no stubs
    """A stream failure that gRPC did not raise itself (no answer in time, closed without
    an error), in the shape ``translate_error`` reads: ``code()`` and ``details()``."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass(frozen=True)
class _Ended:
    """Put on the answer queue by the reader when the stream ends (None: without an error)."""

    error: BaseException | None


class _Stream:
    """One ``LeaseKeepAlive`` call on one pyetcd client, and the thread reading its answers."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._requests: queue.Queue[Any] = queue.Queue()  # None ends the request iterator
        self._unanswered: deque[float] = deque()  # send times, oldest first (refresh only)
        self._answers: queue.Queue[Any] = queue.Queue()
        self._ended = threading.Event()
        self.raft_term: int | None = None  # as the last answer's header said
        self._call = client.leasestub.LeaseKeepAlive(
            self._outgoing(),  # no timeout: the stream lives until closed or broken
            credentials=client.call_credentials,
            metadata=client.metadata,
        )
        self._reader = threading.Thread(
            target=self._read, name="phalanx-keepalive-stream", daemon=True
        )
        self._reader.start()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def refresh(self, lease_id: int, timeout_s: float, stale_s: float) -> tuple[int, float]:
        """Send one keepalive; (the TTL etcd answered, <= 0: the lease is gone; the send
        time of the request answered). Answers come in the order of the requests, so one
        that comes late (its refresh gave up waiting) still confirms the lease, as of its
        own send time. No answer within `timeout_s` raises a gRPC error; the stream is
        closed only once a request has waited `stale_s` (or on an error): a daemon short
        of CPU reads its answers late, and a new stream would cost more than waiting."""
        sent = time.monotonic()
        self._unanswered.append(sent)
        self._requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
        deadline, best = sent + timeout_s, None
        while self._unanswered:
            try:
                answer = self._answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if best is not None:  # a late answer confirmed the lease meanwhile
                    return best
                waited = time.monotonic() - self._unanswered[0]
                if waited < stale_s:  # not through the connection: it would drop the client
                    raise EtcdUnavailable(
                        f"etcd has not answered a lease keepalive for {waited:.1f} s."
                    ) from None
                self.close()
                raise _StreamError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "no lease keepalive answer in time"
                ) from None
            if isinstance(answer, _Ended):
                self.close()
                if answer.error is not None:
                    raise answer.error
                raise _StreamError(
                    grpc.StatusCode.UNAVAILABLE, "etcd closed the lease keepalive stream"
                )
            asked = self._unanswered.popleft()
            self.raft_term = int(answer.header.raft_term)
            if int(answer.ID) == lease_id:
                best = (int(answer.TTL), asked)
                if best[0] <= 0:
                    return best
        assert best is not None  # the last answer was this request's
        return best

    def close(self) -> None:
        """End the request iterator (gRPC's sender thread returns) and cancel the call (the
        reader returns). Idempotent; safe from any thread but the reader."""
        self._requests.put(None)
        self._call.cancel()
        self._reader.join(timeout=READER_JOIN_S)

    def _outgoing(self) -> Iterator[Any]:
        yield from iter(self._requests.get, None)

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            for answer in self._call:
                self._answers.put(answer)
        except grpc.RpcError as exc:  # CANCELLED after close(), or a failed connection
            error = exc  # refresh() raises it
        except Exception as exc:  # anything else ends the stream too: a transient failure
            error = _StreamError(grpc.StatusCode.UNKNOWN, f"the keepalive stream failed: {exc!r}")
        finally:
            self._ended.set()
            self._answers.put(_Ended(error))


class LeaseKeepAlive:
    """One ``LeaseKeepAlive`` stream on a connection's current client, opened on first use
    and again after a failure. Refreshes are sent one at a time. Thread-safe."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._closed = False
        # etcd's raft term as its last keepalive answer said, and when (epoch s): it moves
        # on when etcd itself failed or elected a leader anew, not when only this node
        # lost it (daemon.accounting.incidents).
        self.raft_told: tuple[int | None, float | None] = (None, None)

    @property
    def timeout_s(self) -> float:
        return self.conn.timeout_s

    def refresh(self, lease_id: int, timeout_s: float, stale_s: float) -> tuple[int, float]:
        """One keepalive of `lease_id` on the stream: (the TTL etcd answered, <= 0: the
        lease is gone; the send time it confirms). Raises :class:`CoordinationError`
        (:class:`EtcdUnavailable` while etcd is away); see :meth:`_Stream.refresh`."""
        with self._lock:
            if self._closed:
                raise CoordinationError("the lease keepalive is closed.")
            return self.conn.call(
                lambda client: self._refresh(client, lease_id, timeout_s, stale_s)
            )

    def _refresh(
        self, client: Any, lease_id: int, timeout_s: float, stale_s: float
    ) -> tuple[int, float]:
        stream = self._on(client)
        answered = stream.refresh(lease_id, timeout_s, stale_s)
        if stream.raft_term is not None:
            self.raft_told = (stream.raft_term, time.time())
        return answered

    def close(self) -> None:
        """Close the stream, its reader thread and the connection (the keepalive's own);
        later refreshes raise. A refresh in flight fails at once (its stream is gone)."""
        self._closed = True
        stream = self._stream
        if stream is not None:
            stream.close()  # a refresh in flight on it fails at once
        with self._lock:  # and none can open another after this
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self.conn.close()

    def _on(self, client: Any) -> _Stream:
        """The stream on `client`: the open one, or a new one (the first, after a failure,
        after the connection rebuilt its client, or when etcd ended it while idle)."""
        stream = self._stream
        if stream is not None and (stream.client is not client or stream.ended):
            stream.close()
            stream = None
        if stream is None:
            stream = self._stream = _Stream(client)
        return stream


# -------------------------------------------------------------------------- session


class _Session:
    """One lease and the daemon thread that refreshes it every ``refresh_every_s(ttl)``."""

    def __init__(
        self,
        lease_id: int,
        ttl: int,
        keepalive: LeaseKeepAlive,
        job: str,
        every_s: float | None = None,
    ) -> None:
        self.lease_id = lease_id
        self.job = job
        self.ttl = ttl
        self.every_s = refresh_every_s(ttl) if every_s is None else every_s
        self._keepalive = keepalive
        self._lock = threading.Lock()  # the fields below
        self._refreshing = threading.Lock()  # one refresh of this lease at a time
        self._deadline = time.monotonic() + ttl
        self._gone = False
        self._attempts = 0  # refreshes on the stream that ended, either way
        self._failure: CoordinationError | None = None  # the last one's error, if it failed
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"phalanx-keepalive-{lease_id:x}", daemon=True
        )

    @property
    def alive(self) -> bool:
        with self._lock:
            return not self._gone and time.monotonic() < self._deadline

    @property
    def deadline(self) -> float:
        """When etcd may expire the lease, by our clock: the last confirmed refresh + TTL."""
        with self._lock:
            return -1.0 if self._gone else self._deadline

    @property
    def confirmed_gone(self) -> bool:
        """etcd itself said the lease no longer exists."""
        with self._lock:
            return self._gone

    @property
    def failure(self) -> CoordinationError | None:
        """The error of the last refresh on the stream; None when it succeeded (or none ended)."""
        with self._lock:
            return self._failure

    @property
    def running(self) -> bool:
        """The keepalive thread runs (it ends when the session is lost or stopped)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def mark_gone(self) -> None:
        with self._lock:
            self._gone = True

    def refresh(self, conn: _Connection | None = None) -> bool:
        """One keepalive; True while the lease lives. Raises EtcdUnavailable.

        Without `conn`: on the daemon's one keepalive stream, and its outcome is what
        :attr:`failure` reports. With `conn`: a one-off request on that connection
        (pyetcd's ``refresh_lease``, a stream of one message). The revive path uses the
        one-off: it asks about a lease our clock already gave up on, once after an
        outage, on the main connection that the caller just found answering, so it
        neither waits behind a refresh still stuck on the old stream nor counts as the
        keepalive's outcome.
        """
        if conn is not None:
            sent = time.monotonic()
            answers = conn.call(lambda c: list(c.refresh_lease(self.lease_id)))
            if not answers:
                raise EtcdUnavailable("etcd closed the lease keepalive stream without an answer.")
            return self._confirmed(sent, int(answers[0].TTL))
        with self._refreshing:
            return self._refresh_on_stream()

    def confirm(self, recheck: bool) -> bool:
        """True while the lease lives, as the keepalive thread last learned, without a
        request while its last refresh succeeded and not `recheck` (the caller saw etcd
        fail since the lease's last confirmation). Otherwise the lease is in doubt: one
        refresh on the stream now (etcd may be back, or gone since), or, when the
        thread's refresh is in flight, that one's outcome. Raises its error."""
        with self._lock:
            seen, failed = self._attempts, self._failure is not None
        if not failed and not recheck:
            return self.alive
        with self._refreshing:
            with self._lock:
                if self._attempts != seen:  # the thread's refresh ended while we waited
                    if self._failure is not None:
                        raise self._failure.with_traceback(None)
                    return not self._gone
            return self._refresh_on_stream()

    def revived(self, conn: _Connection) -> _Session | None:
        """This lease with a new keepalive thread, if etcd still holds it although our
        clock gave up on it (a restarted etcd restores leases with a fresh TTL); None
        once etcd says it expired. Raises EtcdUnavailable."""
        again = _Session(self.lease_id, self.ttl, self._keepalive, self.job, self.every_s)
        if again.refresh(conn):
            return again
        self.mark_gone()
        return None

    def kept(self, conn: _Connection) -> _Session | None:
        """Stop this session's thread; this lease again, its new thread started, if etcd
        still holds it although our clock gave up on it, else None. Raises EtcdUnavailable."""
        self.stop()
        again = None if self.confirmed_gone else self.revived(conn)
        if again is not None:
            again.start()
        return again

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the stream stays: it is the daemon's, see LeaseKeepAlive.close)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._keepalive.timeout_s + 1.0)

    def _refresh_on_stream(self) -> bool:
        """One keepalive on the stream, its outcome kept (hold ``_refreshing``)."""
        stale_s = max(self._keepalive.timeout_s, self.ttl / 2.0)
        try:
            ttl, sent = self._keepalive.refresh(self.lease_id, self._keepalive.timeout_s, stale_s)
        except CoordinationError as exc:
            with self._lock:
                self._attempts += 1
                self._failure = exc
            raise
        with self._lock:
            self._attempts += 1
            self._failure = None
        return self._confirmed(sent, ttl)

    def _confirmed(self, sent: float, ttl: int) -> bool:
        with self._lock:
            if ttl <= 0:
                self._gone = True
            else:
                self._deadline = max(self._deadline, sent + ttl)
        return ttl > 0

    def _run(self) -> None:
        """Refresh at once (etcd's raft term, which the incident record waits for after a
        cut, is then known; a refresh interval later, a daemon killed meanwhile lost the
        cut's record), then every ``refresh_every_s(ttl)`` after the last confirmed send
        (a refresh from the main loop counts); after a failure as often until it is lost."""
        interval = self.every_s
        wait, failing = 0.0, False
        ctx = {"job": self.job, "lease": f"{self.lease_id:x}"}
        while not self._stop.wait(wait):
            try:
                if self.refresh() and failing:
                    log.info("etcd_keepalive_recovered", **ctx)
                failing = False
            except CoordinationError as exc:
                if not failing:
                    log.warning("etcd_keepalive_failed", error=str(exc), **ctx)
                failing = True
            if not self.alive:
                log.warning("etcd_session_lost", **ctx)
                return
            confirmed = self.deadline - self.ttl
            wait = interval if failing else max(0.0, confirmed + interval - time.monotonic())
