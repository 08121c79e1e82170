"""The node's one etcd lease at a time (its record and slot are bound to it): made,
kept when etcd still holds it, replaced when lost, and asked about by the main loop
without a request while the keepalive thread is sure of it (keepalive.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from daemon.coordination.etcd_client import CoordinationError, SessionExpired, _Connection
from daemon.coordination.keepalive import LeaseKeepAlive, _Session
from trainer import logs

log = logs.get()


class NodeLease:
    def __init__(self, conn: _Connection, keepalive: LeaseKeepAlive, job: str, ttl_s: int) -> None:
        self._conn, self._keepalive, self.job, self.ttl_s = conn, keepalive, job, ttl_s
        self._session: _Session | None = None
        self._lock = threading.Lock()
        self._failed_at = 0.0  # when a request last found etcd unavailable (unreachable)

    def ensure(self, call: Callable[[Callable[[Any], Any]], Any]) -> bool:
        """Make sure a live lease exists; True when a new one was granted (through `call`,
        the coordinator's request wrapper): the caller registers again. No request while
        the keepalive thread is sure of the lease (``_Session.confirm``: it is asked on
        the stream after a failed refresh, or a failed request)."""
        with self._lock:
            old = self._session
            recheck = old is not None and self._failed_at >= old.deadline - old.ttl
            if old is not None and old.alive and old.running and old.confirm(recheck):
                return False
            # Our clock gave up on it; if etcd still holds it, nothing changed hands.
            again = old.kept(self._conn) if old is not None else None
            if again is not None:
                self._session = again
                log.info("etcd_lease_kept", job=self.job, lease=f"{again.lease_id:x}")
                return False
            grant = call(lambda c: c.lease(self.ttl_s))
            session = _Session(int(grant.id), int(grant.ttl), self._keepalive, self.job)
            session.start()
            self._session = session
        log.info("etcd_session_created", job=self.job, lease=f"{grant.id:x}", ttl=grant.ttl)
        return True

    def unreachable(self) -> None:
        """A request just found etcd unavailable: the next :meth:`ensure` asks the keepalive
        stream about a lease it would otherwise take as confirmed."""
        self._failed_at = time.monotonic()

    def confirmation(self) -> tuple[str, float] | None:
        """(lease id in hex, send time of its last confirmed refresh), None without one."""
        session = self._session
        if session is None or session.deadline < 0:
            return None
        return f"{session.lease_id:x}", session.deadline - session.ttl

    def unconfirmed(self, margin_s: float) -> bool:
        """Whether the lease may expire within `margin_s` (or has), as far as we know."""
        session = self._session
        return session is not None and time.monotonic() >= session.deadline - margin_s

    @property
    def alive(self) -> bool:
        session = self._session
        return session is not None and session.alive

    def gone(self) -> None:
        """etcd said the lease is gone: the next ensure() replaces it."""
        session = self._session
        if session is not None:
            session.mark_gone()

    def lease_id(self) -> int:
        """The live lease's id, for a key bound to it; raises without one."""
        session = self._session
        if session is None:
            raise CoordinationError("no etcd session yet: call ensure_session() first.")
        if not session.alive:
            raise SessionExpired(
                "this node's etcd lease has expired; call ensure_session() and register again."
            )
        return session.lease_id

    def close(self, revoke: bool) -> None:
        """Stop refreshing the lease; revoke it (its keys go at once) when `revoke`."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.stop()
            if revoke:
                self.revoke(session.lease_id)
        self._keepalive.close()

    def revoke(self, lease_id: int) -> None:
        """Revoke `lease_id`, logging (never raising) a failure: a lease already gone is none."""
        try:  # not the coordinator's call: "lease not found" is about lease_id, not ours
            self._conn.call(lambda c: c.revoke_lease(lease_id))
        except CoordinationError as exc:
            if not isinstance(exc, SessionExpired):
                log.warning("etcd_lease_revoke_failed", lease=f"{lease_id:x}", error=str(exc))
