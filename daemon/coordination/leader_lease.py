"""The leader's own short lease (``etcd.leader_ttl_s``, 1 s by default), apart from the node's.

The ``leader``, ``lighthouse`` and ``lost`` keys live on it, so a lost leader's keys vanish
0.75-1.5 s after its last keepalive (etcd checks for expired leases every half second),
not after the node lease's TTL. etcd grants no lease shorter than 1.5 of its election
timeouts: the etcds Phalanx starts (embedded, Kubernetes) grant 1 s; one at etcd's
default timing grants 2 s, which is then kept alive at its own cadence. Before, the node
lease's TTL: that TTL (10 s) was most of what losing the leader's node cost the
job (issue 36). Only the leader holds one; it is kept alive from a thread of its own
(:class:`~daemon.coordination.keepalive._Session`) on a keepalive stream and connection
of its own, so the node's keepalive, a slow request of the main loop or the node lease
being in doubt never delay it.

A leader lease that our clock gave up on is not given up: etcd may still hold it (a
restarted etcd restores leases with a fresh TTL, an outage shorter than the TTL never
lapsed it). :meth:`LeaderLease.current` asks etcd once and goes on with it; only a
lease etcd itself expired is replaced, and the leader key must then be taken again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyetcd import transactions as etx

from daemon.coordination.etcd_client import (
    CoordinationError,
    EtcdSettings,
    SessionExpired,
    _Connection,
)
from daemon.coordination.identity import Identity, holder_of
from daemon.coordination.job_view import leader_value
from daemon.coordination.keepalive import LeaseKeepAlive, _Session
from trainer import logs

log = logs.get()


def leader_refresh_s(ttl_s: float) -> float:
    """How often the leader lease is kept alive: four times a TTL (0.25 s for 1 s). The key
    goes TTL after the last keepalive etcd took, so a longer interval lapses a lost
    leader's key no later on average, and four tries before it lapses ride out a late
    answer; on the one node that leads, four messages a second besides its node lease."""
    return ttl_s / 4.0


Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]
DEFAULT_LEADER_TTL_S = 1  # etcd grants it with an election timeout of 750 ms or less


class LeaderLease:
    """The lease of this node's leadership: granted when it campaigns, revoked when it resigns."""

    def __init__(self, settings: EtcdSettings, job: str, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self.job = job
        timeout = max(0.5, min(settings.timeout_s, ttl_s / 3.0))
        self._conn = _Connection(settings, timeout)
        self._keepalive = LeaseKeepAlive(_Connection(settings, timeout))
        self._session: _Session | None = None
        self._leading = ""  # the leader value we wrote last (it may carry an epoch)
        self._told_longer = False  # etcd granted more than asked, and we said so

    @property
    def held(self) -> bool:
        """A lease is held and alive by our clock (etcd confirmed it within its TTL)."""
        session = self._session
        return session is not None and session.alive and session.running

    @property
    def lease_id(self) -> int | None:
        """The lease held now (alive or not by our clock), None without one."""
        session = self._session
        return None if session is None else session.lease_id

    def current(self) -> int:
        """The id of a live leader lease: the one held, revived if etcd still holds it
        although our clock gave up on it, else a new one. Raises EtcdUnavailable."""
        session = self._session
        if session is not None and session.alive and session.running:
            return session.lease_id
        again = session.kept(self._conn) if session is not None else None
        if again is not None:
            self._session = again
            log.info("leader_lease_kept", job=self.job, lease=f"{again.lease_id:x}")
            return again.lease_id
        grant = self._conn.call(lambda c: c.lease(self.ttl_s))
        ttl = int(grant.ttl)  # etcd may grant more than asked (its minimum)
        if ttl > self.ttl_s and not self._told_longer:
            self._told_longer = True
            log.warning(
                "leader_lease_longer",
                asked_s=self.ttl_s,
                granted_s=ttl,
                hint="etcd grants no lease shorter than 1.5 of its election timeouts; run it "
                "with --election-timeout=750 (or less) for a leader replaced in about a second",
            )
        session = _Session(int(grant.id), ttl, self._keepalive, self.job, leader_refresh_s(ttl))
        session.start()
        self._session = session
        return session.lease_id

    def campaign(self, txn: Txn, key: str, me: Identity, epoch: int | None) -> bool:
        """Take the leader `key` on this lease, or keep it if ours; True if we lead.
        `epoch`: that of a lighthouse we still serve (our lease lapsed, nobody took over),
        so that ranks training under it keep their epoch."""
        lease = self.current()
        value = me.holder() if epoch is None else leader_value(me.holder(), epoch)
        ok, responses = txn([etx.Create(key) == 0], [etx.Put(key, value, lease)], [etx.Get(key)])
        if ok:
            self._leading = value
            return True
        if not responses[0]:
            return False  # the leader key vanished in between: campaign again next round
        held, meta = responses[0][0]
        if holder_of(held)[0] != me.node_id:
            return False
        if meta.lease_id == lease and held == self._leading.encode():
            return True
        # Ours (this process's on an older lease, or a predecessor's): kept, on our lease.
        if holder_of(held)[1] == me.instance:
            value = held.decode()
        ok, _ = txn([etx.Mod(key) == meta.mod_revision], [etx.Put(key, value, lease)], [])
        if ok:
            self._leading = value
        return bool(ok)

    def resign(self, txn: Txn, key: str, lighthouse_key: str) -> None:
        """Delete the leader key (and the lighthouse) if ours, then revoke the lease."""
        if self._leading:
            txn(
                [etx.Value(key) == self._leading], [etx.Delete(key), etx.Delete(lighthouse_key)], []
            )
        self.drop(revoke=True)

    def publish(self, txn: Txn, key: str, lighthouse_key: str, address: str) -> bool:
        """Put the lighthouse `address` on this lease while the leader key is ours."""
        lease = self.current()
        put = [etx.Put(lighthouse_key, address, lease)]
        ok, _ = txn([etx.Value(key) == self._leading], put, [])
        return bool(ok)

    def drop(self, revoke: bool) -> None:
        """Stop keeping the lease alive; with `revoke`, end it now (else it lapses in its TTL)."""
        session, self._session = self._session, None
        if session is None:
            return
        session.stop()
        if not revoke:
            return
        try:
            self._conn.call(lambda c: c.revoke_lease(session.lease_id))
        except CoordinationError as exc:
            if not isinstance(exc, SessionExpired):
                log.warning("leader_lease_revoke_failed", error=str(exc))

    def close(self, revoke: bool = True) -> None:
        self.drop(revoke)
        self._keepalive.close()
        self._conn.close()
