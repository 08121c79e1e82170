"""The incident record: each failure a node lives through, as one value.

An incident opens when the node sees a failure of its own (its ranks exit or hang, its
daemon's previous life ended without leaving, it lost etcd, a rank reports a refused
checkpoint, a non-finite step or divergence, a drain) and closes when the node's ranks
commit a step again after the failure's cause ended (or, for a drain, when the node
leaves). A straggler is not one: the job goes on at the slow rank's pace, which
``PhalanxStraggler`` and the ``straggler`` events report. The node reports
what happened to itself, so a failure is recorded once: by the node it struck. etcd
down, which every node lives through, gets one name that every node computes alike
(:func:`shared_key`), so its records are one; a cold restart's are made one when the
record is read (``daemon.coordination.incident_store``).

Everything here is a value: :class:`IncidentLog` returns a new one with each change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

KEEP = 20  # closed incidents a node keeps in memory (and shows on /status)


class Kind(StrEnum):
    RANK_EXIT = "rank_exit"  # a rank exited or was killed
    HANG = "hang"  # a rank made no progress for its phase's hang timeout
    NODE_LOST = "node_lost"  # the daemon ended without leaving (killed, crashed, host down)
    LEADER_LOST = "leader_lost"  # ... while it led the job (its lighthouse went with it)
    PARTITION = "partition"  # this node lost etcd while etcd itself stayed up (cut off)
    ETCD_OUTAGE = "etcd_outage"  # etcd itself was away (its raft term moved on)
    NON_FINITE = "non_finite"  # a step voted down for a NaN or infinite loss or gradient
    DIVERGENCE = "divergence"  # the groups' parameters differed
    CHECKPOINT = "checkpoint"  # a checkpoint failed to save, or was refused at load
    DRAIN = "drain"  # SIGTERM: the node left the job


class Action(StrEnum):
    NONE = "none"  # ridden out: the ranks went on
    RESTART = "restart"  # the node's ranks were restarted
    HEAL = "heal"  # ... and healed live from a peer
    COLD_RESTART = "cold_restart"  # ... and loaded a checkpoint: no peer had state
    DRAINED = "drained"  # the node left


# A later finding that explains an open incident better takes its kind: a checkpoint
# refused while the ranks restart is why the restart cost what it did.
# A partition or an outage is why ranks that failed meanwhile failed.
UPGRADES: dict[Kind, frozenset[Kind]] = {
    Kind.CHECKPOINT: frozenset({Kind.RANK_EXIT, Kind.HANG}),
    Kind.PARTITION: frozenset({Kind.RANK_EXIT, Kind.HANG}),
    # etcd's new term can come after it answers again: a partition was an outage.
    Kind.ETCD_OUTAGE: frozenset({Kind.RANK_EXIT, Kind.HANG, Kind.PARTITION}),
}
CUT_OFF = "etcd unreachable from this node while it ran"
# A refused checkpoint as the record knows it: its directory and when that save finished
# (None without a readable marker). The same step saved again is another checkpoint.
Refusal = tuple[str, float | None]
ETCD_LOST_MIN_S = 0.5  # etcd away shorter than this is a blip, not an incident
TERM_WAIT_S = 5.0  # how long etcd's term is waited for once it answers again


@dataclass(frozen=True)
class EtcdSeen:
    """What the node last saw of etcd: whether its last round's requests were answered,
    and its raft term with when a lease keepalive answer said it (epoch s). Right after
    etcd answers again the term may still be the one from before (the keepalive has not
    answered since): only an answer after the loss tells an outage from a cut."""

    up: bool
    term: int | None = None
    term_at: float | None = None


# Actions in the order they say more: a heal is a restart that healed.
ACTION_ORDER = (Action.NONE, Action.RESTART, Action.HEAL, Action.COLD_RESTART, Action.DRAINED)


@dataclass(frozen=True)
class Incident:
    key: str  # its name in etcd (shared_key for a failure every node lives through)
    kind: Kind
    node: str  # the node that recorded it
    group: int | None  # its replica group then
    began: float  # epoch s: when the failure happened, as well as the node can tell
    detected: float  # epoch s: when the daemon knew
    recovered: float | None = None  # epoch s: its ranks committed again (None: open)
    action: Action = Action.NONE
    groups: int = 1  # replica groups it stopped
    detail: str = ""
    checkpoint: str = ""  # the checkpoint refused at load, for a refusal (its directory)
    checkpoint_time: float | None = None  # when that save finished (its marker's time)

    @property
    def refusal(self) -> Refusal:
        """Which save it refused: a later save of the same step takes the same name."""
        return self.checkpoint, self.checkpoint_time

    @property
    def cost_group_s(self) -> float:
        """Group-seconds it cost: from the failure to the recovery, times the groups it
        stopped (0 while open)."""
        if self.recovered is None:
            return 0.0
        return max(0.0, self.recovered - self.began) * self.groups

    def record(self) -> dict[str, Any]:
        """As stored in etcd and shown by ``phalanx status --incidents --json``."""
        return {
            "kind": self.kind.value,
            "node": self.node,
            "group": self.group,
            "began": round(self.began, 3),
            "detected": round(self.detected, 3),
            "recovered": None if self.recovered is None else round(self.recovered, 3),
            "action": self.action.value,
            "groups": self.groups,
            "cost_group_s": round(self.cost_group_s, 3),
            "detail": self.detail,
            "checkpoint": self.checkpoint,
            "checkpoint_time": None
            if self.checkpoint_time is None
            else round(self.checkpoint_time, 3),
        }

    def shown(self) -> dict[str, Any]:
        """As /status and ``phalanx status --incidents --json`` show it: named."""
        return {"name": self.key, **self.record()}


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def refusal(path: str, saved: object) -> Refusal:
    """A refused save as the record keeps it: `saved` (its marker's time, when a number)
    to the millisecond, so one save reads the same on every node and read back."""
    at = _seconds(saved)
    return path, None if at is None else round(at, 3)


def from_record(key: str, value: Mapping[str, Any]) -> Incident | None:
    """An incident read back from etcd, or None when the value is not one."""
    try:
        recovered = value.get("recovered")
        return Incident(
            key=key,
            kind=Kind(str(value["kind"])),
            node=str(value["node"]),
            group=value["group"] if isinstance(value.get("group"), int) else None,
            began=float(value["began"]),
            detected=float(value["detected"]),
            recovered=None if recovered is None else float(recovered),
            action=Action(str(value.get("action", "none"))),
            groups=int(value.get("groups", 1)),
            detail=str(value.get("detail", ""))[:400],
            checkpoint=str(value.get("checkpoint", ""))[:400],
            checkpoint_time=_seconds(value.get("checkpoint_time")),
        )
    except (KeyError, TypeError, ValueError):
        return None


def shared_key(name: str, marker: object) -> str:
    """The name every node gives the same failure that struck them all: what it was and
    what they all saw of it alike (etcd's new raft term)."""
    return f"{name}-{marker}"


@dataclass(frozen=True)
class IncidentLog:
    """A node's incidents: the open one (at most one: what happens while it is open is
    part of it) and the last KEEP closed ones, newest last."""

    node: str = ""
    open: Incident | None = None
    closed: tuple[Incident, ...] = ()
    counts: tuple[tuple[Kind, int, float], ...] = ()  # closed so far: kind, count, cost
    etcd_lost: float | None = None  # epoch s: etcd stopped answering (None: it answers)
    etcd_back: float | None = None  # epoch s: it answers again, its new term not yet told
    etcd_term: int | None = None  # etcd's raft term, as last seen while it answered

    def opened(
        self,
        kind: Kind,
        now: float,
        *,
        began: float | None = None,
        detected: float | None = None,
        group: int | None = None,
        detail: str = "",
        key: str | None = None,
        groups: int = 1,
        checkpoint: Refusal = ("", None),
    ) -> IncidentLog:
        """A failure seen at `now` (epoch s). While one is open it is part of that one,
        which takes its kind (and a shared name) only where that explains it better
        (UPGRADES): a partition that made the ranks fail is the partition."""
        began = now if began is None else min(began, now)
        current = self.open
        if current is not None:
            if current.kind in UPGRADES.get(kind, frozenset()):
                current = replace(
                    current,
                    kind=kind,
                    detail=detail or current.detail,
                    began=min(began, current.began),
                    key=key or current.key,
                    groups=max(groups, current.groups),
                    checkpoint=checkpoint[0] or current.checkpoint,
                    checkpoint_time=checkpoint[1] if checkpoint[0] else current.checkpoint_time,
                )
            return replace(self, open=current)
        incident = Incident(
            key=key or f"{self.node}-{int(now * 1000)}",
            kind=kind,
            node=self.node,
            group=group,
            began=began,
            detected=now if detected is None else max(began, min(detected, now)),
            groups=groups,
            detail=detail,
            checkpoint=checkpoint[0],
            checkpoint_time=checkpoint[1],
        )
        return replace(self, open=incident)

    def acted(self, action: Action) -> IncidentLog:
        """What was done about the open incident (the most telling action stays)."""
        current = self.open
        if current is None or ACTION_ORDER.index(action) <= ACTION_ORDER.index(current.action):
            return self
        return replace(self, open=replace(current, action=action))

    def struck(self, groups: int) -> IncidentLog:
        """The open incident stopped `groups` replica groups (a cold restart: all)."""
        if self.open is None:
            return self
        return replace(self, open=replace(self.open, groups=max(groups, 1)))

    def committed(self, now: float) -> IncidentLog:
        """The node's ranks committed a step: an open incident ends."""
        if self.open is None:
            return self
        return self._close(now)

    def left(self, now: float) -> IncidentLog:
        """The node leaves (its daemon exits), or has no ranks whose step could end what
        is open (it waits as a spare, or etcd came back while none ran): it ends here."""
        return self if self.open is None else self._close(now)

    def etcd(
        self,
        now: float,
        seen: EtcdSeen,
        groups: int,
        group: int | None = None,
        running: bool = True,
    ) -> IncidentLog:
        """What etcd answered at `now`. When it answers again after ETCD_LOST_MIN_S, and
        its raft term is known from an answer since (or TERM_WAIT_S passed): an etcd
        outage if the term moved on (etcd itself failed or elected anew: every node lived
        through it, so it takes a name they all give it), else a partition of this node
        from a running etcd. Where no ranks run (`running`), one it opens is over at once."""
        log = self._etcd(now, seen, groups, group)
        fresh = self.open is None and log.open is not None
        return log.left(now) if fresh and not running else log

    def _etcd(self, now: float, seen: EtcdSeen, groups: int, group: int | None) -> IncidentLog:
        lost, known = self.etcd_lost, self.etcd_term
        if seen.up and lost is None and seen.term in (None, known):
            return self  # every tick while etcd answers: nothing new
        if not seen.up:
            return (
                self
                if lost is not None and self.etcd_back is None
                else replace(self, etcd_lost=lost if lost is not None else now, etcd_back=None)
            )
        told = seen.term is not None and seen.term_at is not None
        fresh = told and (lost is None or (seen.term_at or 0.0) > lost)
        term = seen.term if fresh else known
        moved = fresh and known is not None and seen.term != known
        if lost is None:  # the term moved on while etcd answered: an open cut was an outage
            back = replace(self, etcd_term=term)
            cut = self.open is not None and self.open.detail == CUT_OFF
            return back._outage(now, term, groups, None) if moved and cut else back
        came_back = self.etcd_back if self.etcd_back is not None else now
        if came_back - lost < ETCD_LOST_MIN_S:  # a blip
            return replace(self, etcd_lost=None, etcd_back=None, etcd_term=term)
        if not fresh and now - came_back < TERM_WAIT_S:  # the keepalive's next answer
            return self if self.etcd_back is not None else replace(self, etcd_back=now)
        back = replace(self, etcd_lost=None, etcd_back=None, etcd_term=term)
        if self.open is not None and self.open.began > came_back:
            # A failure since etcd came back is one of its own: this one ended with it.
            done = replace(back, open=None)
            done = done._outage(now, term, groups, lost) if moved else done._cut(now, lost, group)
            return replace(done.left(came_back), open=self.open)
        if moved:
            return back._outage(now, term, groups, lost)
        return back._cut(now, lost, group)

    def _cut(self, now: float, lost: float, group: int | None) -> IncidentLog:
        return self.opened(
            Kind.PARTITION, now, began=lost, detected=lost, detail=CUT_OFF, group=group
        )

    def _outage(self, now: float, term: int | None, groups: int, lost: float | None) -> IncidentLog:
        key = shared_key(Kind.ETCD_OUTAGE, term)
        why = "etcd itself was away (its raft term moved on)"
        return self.opened(
            Kind.ETCD_OUTAGE, now, began=lost, detected=lost, key=key, groups=groups, detail=why
        )

    def _close(self, now: float) -> IncidentLog:
        assert self.open is not None
        done = replace(self.open, recovered=max(now, self.open.detected))
        tally = {kind: (n, cost) for kind, n, cost in self.counts}
        n, cost = tally.get(done.kind, (0, 0.0))
        tally[done.kind] = (n + 1, cost + done.cost_group_s)
        counts = tuple((kind, n, cost) for kind, (n, cost) in tally.items())
        return replace(self, open=None, closed=(*self.closed, done)[-KEEP:], counts=counts)

    def every(self) -> tuple[Incident, ...]:
        """Closed ones, then the open one."""
        return self.closed if self.open is None else (*self.closed, self.open)
