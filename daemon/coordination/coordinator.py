"""The etcd coordination layer: one :class:`Coordinator` per daemon.

Everything a job shares lives under ``/phalanx/<job>/`` as JSON (see DESIGN.md): the job-file
``spec``, ``nodes/<node_id>`` records, replica-group slots ``groups/<gid>``, the ``leader`` and
its ``lighthouse`` address, the newest ``checkpoints/latest`` and the job ``state``.

Identity. Slot and leader values are ``{"node", "instance"}`` and the record carries the
instance (``daemon.coordination.identity``): :meth:`Coordinator.register` refuses a node id that
another daemon process holds (:class:`NodeIdHeld`), and claims keys of this node id from the
process's predecessor.

Sessions. A node's record and slot are bound to one etcd lease (``session.NodeLease``, kept
alive over the daemon's one keepalive stream); the ``leader`` and ``lighthouse`` keys to the
leader's own short lease (``leader_lease``). :meth:`Coordinator.ensure_session` replaces a lost
lease and returns True: the caller then registers and claims again. A lease our clock gave up on
but etcd still holds (a restarted etcd restores leases) is kept.

Failures are mapped to the exceptions of ``etcd_client`` (re-exported here):
:class:`EtcdUnavailable` is transient, :class:`EtcdAccessDenied` is a configuration problem,
:class:`SpecMismatch` refuses a node with another job file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn

from daemon.coordination import slots as slot_keys
from daemon.coordination.etcd_client import (
    CoordinationError,
    EtcdAccessDenied,
    EtcdSettings,
    EtcdUnavailable,
    NodeIdHeld,
    NotLeader,
    SessionExpired,
    SpecMismatch,
    T,
    _Connection,
    translate_error,
)
from daemon.coordination.group_keys import bump_generation, generation_key, store_key
from daemon.coordination.identity import Identity, holder_of, new_instance
from daemon.coordination.incident_store import IncidentStore
from daemon.coordination.job_secret import get_or_make_secret
from daemon.coordination.job_spec import put_spec
from daemon.coordination.job_view import STATES, JobView, dump, parse_job
from daemon.coordination.keepalive import LeaseKeepAlive
from daemon.coordination.latest_checkpoint import publish_latest
from daemon.coordination.leader_lease import DEFAULT_LEADER_TTL_S, LeaderLease
from daemon.coordination.leader_suspects import LeaderSuspects
from daemon.coordination.node_key import put_record
from daemon.coordination.progress import (
    ASK_KEY,
    Progress,
    parse_progress,
    parse_reached,
    progress_key,
    progress_prefix,
    reached_key,
)
from daemon.coordination.session import NodeLease
from trainer import logs

log = logs.get()

__all__ = [
    "STATES",
    "CoordinationError",
    "Coordinator",
    "EtcdAccessDenied",
    "EtcdSettings",
    "EtcdUnavailable",
    "JobView",
    "NodeIdHeld",
    "NotLeader",
    "SessionExpired",
    "SpecMismatch",
    "translate_error",
]


class Coordinator:
    """This node's view of one job in etcd: session, registration, slots, leadership, state.

    Methods that write something bound to the lease need a live session
    (:meth:`ensure_session` first); each raises :class:`EtcdUnavailable` (or
    :class:`SessionExpired`) when it cannot do its job now and the caller should
    retry later.
    """

    def __init__(
        self,
        settings: EtcdSettings,
        job: str,
        node_id: str,
        lease_ttl_s: int,
        identity: Identity | None = None,
        *,
        leader_ttl_s: int = DEFAULT_LEADER_TTL_S,
    ) -> None:
        if not settings.endpoints:
            raise CoordinationError("no etcd endpoints configured; set etcd.endpoints.")
        settings.check(lease_ttl_s, job, node_id)  # the same check as a job file's
        self.settings, self.job = settings, job
        self.node_id, self.lease_ttl_s = node_id, lease_ttl_s
        self.prefix = f"/phalanx/{job}/"
        self.identity = identity or Identity(node_id, new_instance())
        self._me = self.identity.holder()  # the value of the slot and leader keys we hold
        self._conn = _Connection(settings, settings.timeout_s)
        keepalive_timeout = max(0.5, min(settings.timeout_s, lease_ttl_s / 3.0))
        self.keepalive = keepalive = LeaseKeepAlive(_Connection(settings, keepalive_timeout))
        self._lease_of = NodeLease(self._conn, keepalive, job, lease_ttl_s)  # record, slot
        self._leader = LeaderLease(settings, job, min(leader_ttl_s, lease_ttl_s))
        self._record: tuple[int, str] | None = None  # (lease, value) of our record as last put
        self._secret: bytes | None = None  # the job's (job_secret), once read
        self.suspects = LeaderSuspects(self._call, self._txn, self._key, self._lease, node_id)
        self.incidents = IncidentStore(self._call, job)  # the job's incident record

    # ------------------------------------------------------------------ session

    def connect(self) -> None:
        """Reach etcd and check that this user may read the job's keys.

        A transient failure is retried twice on a fresh connection (a first
        handshake can race a connection that is shutting down), all within
        ``timeout_s``; access problems are raised at once.
        """
        deadline = time.monotonic() + self.settings.timeout_s
        for attempt in range(3):
            try:
                self._call(lambda c: c.get(self._key("spec")))
                return
            except EtcdUnavailable:
                if attempt == 2 or time.monotonic() + 0.2 > deadline:
                    raise
                time.sleep(0.2)

    def ensure_session(self) -> bool:
        """Make sure a live lease exists; True when a new one was created (re-register then)."""
        return self._lease_of.ensure(self._call)

    def lease_confirmation(self) -> tuple[str, float] | None:
        """(lease id in hex, send time of its last confirmed refresh), None without a session."""
        return self._lease_of.confirmation()

    def session_unconfirmed(self, margin_s: float) -> bool:
        """Whether the lease may expire within `margin_s` (or has), as far as we know."""
        return self._lease_of.unconfirmed(margin_s)

    @property
    def session_alive(self) -> bool:
        return self._lease_of.alive

    # --------------------------------------------------------------------- spec

    def job_secret(self) -> bytes:
        """The job's secret (``daemon.coordination.job_secret``): read once, then kept."""
        if self._secret is None:
            self._secret = get_or_make_secret(self._txn, self._key("secret"))
        return self._secret

    def check_spec(self, sections: dict[str, str]) -> None:
        """Write the job spec, or check ours equals it (``daemon.coordination.job_spec``)."""
        put_spec(self.job, sections, self._txn, self._key)

    # ------------------------------------------------------------ node and slot

    def register(self, record: dict[str, Any]) -> None:
        """Put ``nodes/<node_id>`` bound to the lease, with this process's instance.

        Raises :class:`NodeIdHeld` when the record belongs to another daemon process
        (not this one, nor its predecessor on the same run directory): node_key.py."""
        lease, key = self._lease(), self._key(f"nodes/{self.node_id}")
        value = dump({**record, "instance": self.identity.instance})
        last, self._record = self._record, None
        put_record(self._txn, key, value, lease, last, self.identity)
        self._record = (lease, value)

    def claim_slot(
        self, max_replicas: int, preferred: int | None = None, nodes_per_group: int = 1
    ) -> int | None:
        """Claim a replica-group slot (a seat, gid x nodes_per_group + node rank, where
        groups span nodes): one this node id holds already, else ``preferred``, else a free
        one spread among the joiners (``daemon.coordination.slots``); None if all are taken."""
        npg, slots = nodes_per_group, max_replicas * nodes_per_group
        lease, prefix = self._lease(), self._key(slot_keys.slot_prefix(npg))
        held = slot_keys.held_slots(prefix, self._range(slot_keys.slot_prefix(npg)), npg)
        gid = slot_keys.mine(held, self.node_id, slots)
        if gid is not None and slot_keys.rebind(
            self._txn, prefix + slot_keys.slot_suffix(gid, npg), held[gid], self._me, lease
        ):
            return gid
        if all(g in held for g in range(slots)):
            return None
        registered = self._call(
            lambda c: c.get_prefix_response(self._key("nodes/"), count_only=True)
        ).count
        return slot_keys.claim_free(
            self._txn,
            prefix,
            held,
            self._me,
            lease,
            node_id=self.node_id,
            max_replicas=slots,
            preferred=preferred,
            joiners=int(registered) - len(held),
            nodes_per_group=npg,
        )

    def seat_holder(self, seat: int, nodes_per_group: int) -> str | None:
        """The node id holding seat `seat` now (None: free), read from etcd itself."""
        return holder_of(self._get(slot_keys.seat_key(seat, nodes_per_group)))[0]

    def revoke_seat(self, seat: int, nodes_per_group: int, member: str) -> bool:
        """Delete seat `seat`'s key if `member` still holds it (``slots.revoke_held``)."""
        key = slot_keys.seat_key(seat, nodes_per_group)
        return slot_keys.revoke_held(self._txn, self._key(key), self._get(key), member)

    def release_slot(self, gid: int, nodes_per_group: int = 1) -> None:
        """Delete ``groups/<gid>`` (or seat `gid`'s key) if this node holds it."""
        key = self._key(slot_keys.seat_key(gid, nodes_per_group))
        self._txn([txn.Value(key) == self._me], [txn.Delete(key)], [])

    def bump_generation(self, gid: int, seen: int) -> int:
        """Move group `gid`'s generation on from `seen` (``group_keys``); the one now."""
        return bump_generation(self._txn, self._key(generation_key(gid)), seen)

    def publish_store(self, gid: int, record: dict[str, Any]) -> None:
        """Put ``stores/<gid>``, the group's store for one generation, on our lease."""
        lease, key = self._lease(), self._key(store_key(gid))
        self._call(lambda c: c.put(key, dump(record), lease=lease))

    # --------------------------------------------------------------- leadership

    def campaign(self, epoch: int | None = None) -> bool:
        """Try to become the leader; True if this node is (now or already) the leader
        (``LeaderLease.campaign``: `epoch` is that of a lighthouse we still serve)."""
        return self._leader.campaign(self._txn, self._key("leader"), self.identity, epoch)

    @property
    def leader_lease_held(self) -> bool:
        """Our leader lease is alive by our clock and its keepalive runs."""
        return self._leader.held

    @property
    def leader_lease_id(self) -> int | None:
        return self._leader.lease_id

    def drop_leadership(self) -> None:
        """Stop keeping the leader lease alive (a fence): it lapses within its TTL."""
        self._leader.drop(revoke=False)

    def resign(self) -> None:
        """Give up leadership (and the lighthouse address) if this node holds it."""
        self._leader.resign(self._txn, self._key("leader"), self._key("lighthouse"))

    def publish_lighthouse(self, address: str) -> None:
        """Put ``lighthouse`` bound to the leader lease; raises NotLeader unless this node leads."""
        if not self._leader.publish(
            self._txn, self._key("leader"), self._key("lighthouse"), dump(address)
        ):
            raise NotLeader(f"node '{self.node_id}' is not the leader of job '{self.job}'.")

    def announce_lost(self, quorum_id: int, replicas: list[str], lighthouse: str) -> None:
        """Put ``lost``: the members of quorum `quorum_id` that our lighthouse (published
        at `lighthouse`) stopped hearing from, bound to the leader lease; raises NotLeader
        unless this node leads."""
        value = dump(
            {
                "replicas": replicas,
                "quorum_id": quorum_id,
                "lighthouse": lighthouse,
                "at": time.time_ns(),
            }
        )
        if not self._leader.publish(self._txn, self._key("leader"), self._key("lost"), value):
            raise NotLeader(f"node '{self.node_id}' is not the leader of job '{self.job}'.")

    def announce_failed(self, gid: int, value: dict[str, Any]) -> None:
        """Put ``failed/<gid>``: group `gid`'s ranks failed in a quorum (its daemon's word,
        ``daemon.ranks.failure_notice``), bound to this node's lease."""
        lease = self._lease()
        self._call(lambda c: c.put(self._key(f"failed/{gid}"), dump(value), lease=lease))

    # ---------------------------------------------------------- persistent keys

    def snapshot(self) -> JobView:
        """Everything under the job prefix, from one range read, with its revision."""
        kvs, revision = self.read_job()
        return parse_job(self.prefix, kvs, revision)

    def read_job(self) -> tuple[list[Any], int]:
        """The key-values under the job prefix, from one range read, and its revision."""
        response = self._call(lambda c: c.get_prefix_response(self.prefix))
        return list(response.kvs), int(response.header.revision)

    def watch_job(self, start_revision: int, callback: Callable[[Any], None]) -> int:
        """Call `callback` (on pyetcd's watch thread) with each batch of changes under the
        job prefix from `start_revision` on, and with an error or None when the stream ends."""
        return int(
            self._call(
                lambda c: c.add_watch_prefix_callback(
                    self.prefix, callback, start_revision=start_revision
                )
            )
        )

    def cancel_watch(self, watch_id: int) -> None:
        self._call(lambda c: c.cancel_watch(watch_id))

    # ----------------------------------------------------------------- progress

    def put_progress(self, progress: dict[str, Any], reached: bool = False) -> None:
        """Put this node's progress (its step) outside the watched job prefix, bound to the
        lease (``daemon.coordination.progress``); `reached`: the job's reached step too, in
        the same request."""
        lease = self._lease()
        key, value = progress_key(self.job, self.node_id), dump(progress)
        if not reached:
            self._call(lambda c: c.put(key, value, lease=lease))
            return
        step = dump({"step": progress["step"], "node": self.node_id})
        self._txn([], [txn.Put(key, value, lease), txn.Put(reached_key(self.job), step)], [])

    def read_reached(self) -> int:
        """The highest step the job reached in this run (0: none recorded)."""
        value, _ = self._call(lambda c: c.get(reached_key(self.job)))
        return parse_reached(self.job, value)

    def read_progress(self) -> dict[str, Progress]:
        """Every node's progress, by node id (one range read of the progress prefix)."""
        response = self._call(lambda c: c.get_prefix_response(progress_prefix(self.job)))
        return parse_progress(self.job, response.kvs)

    def ask_progress(self) -> int:
        """Ask every daemon to write its progress now (a put they all watch); returns the
        revision of the ask: an answer is a progress key modified after it."""
        asked = {"node": self.node_id, "instance": self.identity.instance, "at": time.time_ns()}
        value = dump(asked)  # never the last ask's value: a daemon answers each value once
        response = self._call(lambda c: c.put(self._key(ASK_KEY), value))
        return int(response.header.revision)

    def set_state(self, state: str, step: int, **extra: object) -> None:
        """Put the persistent job ``state`` (running, completed or failed) and its step."""
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        value = dump({**extra, "state": state, "step": step})
        self._call(lambda c: c.put(self._key("state"), value))

    def publish_checkpoint(self, record: dict[str, Any]) -> None:
        """Put ``checkpoints/latest`` unless it already names the same or a newer step."""
        publish_latest(self._txn, self._key("checkpoints/latest"), record)

    # -------------------------------------------------------------------- close

    def close(self, revoke: bool = True) -> None:
        """Stop the keepalive; revoke the lease (drops node, slot and leader keys at once)."""
        self._lease_of.close(revoke)
        self._leader.close(revoke)
        self._conn.close()

    # ---------------------------------------------------------------- internals

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _call(self, fn: Callable[[Any], T]) -> T:
        try:
            return self._conn.call(fn)
        except SessionExpired:
            self._lease_of.gone()
            raise
        except EtcdUnavailable:
            self._lease_of.unreachable()
            raise

    def _txn(
        self, compare: list[Any], success: list[Any], failure: list[Any]
    ) -> tuple[bool, list[Any]]:
        ok, responses = self._call(
            lambda c: c.transaction(compare=compare, success=success, failure=failure)
        )
        return bool(ok), list(responses)

    def _get(self, name: str) -> bytes | None:
        value, _ = self._call(lambda c: c.get(self._key(name)))
        return None if value is None else bytes(value)

    def _range(self, name: str) -> list[Any]:
        return list(self._call(lambda c: c.get_prefix_response(self._key(name))).kvs)

    def _lease(self) -> int:
        return self._lease_of.lease_id()
