"""The job's incident record in etcd: ``/phalanx/_incidents/<job>/<name>``, one key per
incident (``daemon.accounting.incidents``), kept where no daemon's watch hears it and
bound to no lease, so it outlives the nodes that wrote it. A node writes an incident
once it is over (and again if it learns more); the record holds at most ``KEEP``
incidents, the oldest deleted by the node that wrote a new one. Read by
``phalanx status``.

An etcd outage, which every node lives through, has one name on every node (by etcd's
new raft term): each node's write merges into the record there (:func:`merged`). A
cold restart (every group's ranks lost at once) is recorded by each node under its own
name, as is a group that came back last and healed from the others: read back, the
records that began within SAME_FAILURE_S of each other are one (:func:`one_per_failure`;
two cold restarts may resume from the same checkpoint, so that cannot name them). A
cold restart that refused a checkpoint the record shows refused before is the ranks'
failure, not the checkpoint's (:func:`refused_once`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from daemon.accounting.incidents import (
    ACTION_ORDER,
    UPGRADES,
    Action,
    Incident,
    Kind,
    Refusal,
    from_record,
)
from daemon.coordination.job_view import dump
from daemon.coordination.records import key_text, load_value

KEEP = 100  # incidents kept in etcd, per job
SAME_FAILURE_S = 2.0  # ranks of other nodes that failed this close to a cold restart's
FOLDED = frozenset({Kind.RANK_EXIT, Kind.HANG, Kind.CHECKPOINT})  # what a cold restart holds

Call = Callable[[Callable[[Any], Any]], Any]


def incident_prefix(job: str) -> str:
    return f"/phalanx/_incidents/{job}/"


def merged(old: Incident, new: Incident) -> Incident:
    """One incident from two nodes' records of it: the kind that explains it better, the
    earliest start and detection, the latest recovery, the most groups and the most
    telling action; the first reporter's node."""
    kind = new.kind if old.kind in UPGRADES.get(new.kind, frozenset()) else old.kind
    action = max(old.action, new.action, key=ACTION_ORDER.index)
    ends = [t for t in (old.recovered, new.recovered) if t is not None]
    return Incident(
        key=old.key,
        kind=kind,
        node=old.node,
        group=old.group,
        began=min(old.began, new.began),
        detected=min(old.detected, new.detected),
        recovered=max(ends) if ends else None,
        action=action,
        groups=max(old.groups, new.groups),
        detail=old.detail if kind == old.kind else new.detail,
        checkpoint=old.checkpoint if kind == old.kind else new.checkpoint,
        checkpoint_time=old.checkpoint_time if kind == old.kind else new.checkpoint_time,
    )


def one_per_failure(incidents: list[Incident]) -> list[Incident]:
    """The record as failures, by when they began: the nodes' records of one cold restart
    (every group's ranks lost at once), and another node's rank exit, hang or refused
    checkpoint that began within SAME_FAILURE_S of one (a group that came back last and
    healed), are one incident."""
    ordered = refused_once(sorted(incidents, key=lambda i: i.began))
    colds: list[Incident] = []
    rest: list[Incident] = []
    # The cold restarts first, so that a rank exit that began before the one it was
    # part of still finds it.
    for cold in (i for i in ordered if i.action == Action.COLD_RESTART):
        if not _fold(colds, cold):
            colds.append(cold)
    for incident in (i for i in ordered if i.action != Action.COLD_RESTART):
        if not _fold(colds, incident):
            rest.append(incident)
    return sorted([*rest, *colds], key=lambda i: i.began)


def _fold(colds: list[Incident], incident: Incident) -> bool:
    """Merge `incident` into the cold restart of `colds` it is part of, if any."""
    at = next((n for n, c in enumerate(colds) if _part_of(incident, c)), None)
    if at is not None:
        colds[at] = merged(colds[at], incident)
    return at is not None


def refused_once(incidents: list[Incident]) -> list[Incident]:
    """`incidents` (by when they began) with a cold restart that refused a checkpoint an
    earlier incident refused (nothing is written to a refused checkpoint: until a newer
    one is saved, each cold restart finds it newest again, on nodes that never saw it)
    told as what it was: the ranks lost, the checkpoint's failure being old news. A
    checkpoint is a save (:attr:`Incident.refusal`): the same step saved again since, and
    refused, is a new failure."""
    seen: set[Refusal] = set()
    out = []
    for incident in incidents:
        again = incident.kind == Kind.CHECKPOINT and incident.refusal in seen
        if again and incident.action == Action.COLD_RESTART:
            why = f"every group's ranks lost; {incident.checkpoint} refused again"
            incident = replace(incident, kind=Kind.RANK_EXIT, detail=why)
        if incident.checkpoint:
            seen.add(incident.refusal)
        out.append(incident)
    return out


def _part_of(incident: Incident, cold: Incident) -> bool:
    """Whether `incident` is another node's record of the cold restart `cold`: it began
    within SAME_FAILURE_S of it and was not over before the other began (a rank exit
    healed in a second, then every rank killed: two failures)."""
    return (
        incident.node != cold.node
        and (incident.action == Action.COLD_RESTART or incident.kind in FOLDED)
        and abs(incident.began - cold.began) <= SAME_FAILURE_S
        and _overlap(incident, cold)
    )


def _overlap(one: Incident, other: Incident) -> bool:
    ends = [i.recovered if i.recovered is not None else float("inf") for i in (one, other)]
    return one.began <= ends[1] and other.began <= ends[0]


def parse_incidents(job: str, kvs: Iterable[Any]) -> list[tuple[Incident, int]]:
    """The job's incidents with their keys' create revisions, oldest first; values that
    are not an incident are skipped."""
    prefix, out = incident_prefix(job), []
    for kv in kvs:
        key = key_text(bytes(kv.key))
        ok, value = load_value(bytes(kv.value), bytes(kv.key))
        if key is None or not ok or not isinstance(value, dict):
            continue
        incident = from_record(key.removeprefix(prefix), value)
        if incident is not None:
            out.append((incident, int(kv.create_revision)))
    return sorted(out, key=lambda pair: pair[1])


class IncidentStore:
    def __init__(self, call: Call, job: str) -> None:
        self._call, self.job = call, job

    def read(self) -> list[Incident]:
        """Every failure of the job in etcd, oldest first (one range read)."""
        return one_per_failure([i for i, _ in self._read()])

    def write(self, incident: Incident) -> None:
        """Put `incident`, merged into the record of the same name if another node wrote
        one; after a new key, delete the oldest beyond KEEP."""
        key = incident_prefix(self.job) + incident.key
        raw, _ = self._call(lambda c: c.get(key))
        ok, value = (False, None) if raw is None else load_value(bytes(raw))
        old = from_record(incident.key, value) if ok and isinstance(value, dict) else None
        record = incident if old is None else merged(old, incident)
        self._call(lambda c: c.put(key, dump(record.record())))
        if old is None:
            self._trim()

    def _read(self) -> list[tuple[Incident, int]]:
        response = self._call(lambda c: c.get_prefix_response(incident_prefix(self.job)))
        return parse_incidents(self.job, response.kvs)

    def _trim(self) -> None:
        held = self._read()
        for incident, _ in held[: max(0, len(held) - KEEP)]:
            self._delete(incident_prefix(self.job) + incident.key)

    def _delete(self, key: str) -> None:
        self._call(lambda c: c.delete(key))
