"""What this node's ranks said of their progress: their events folded into one frozen value.

The rank output threads (the node group's) fold each event into a :class:`ProgressFold`,
which swaps in a new :class:`RankProgress` under its lock; the supervisor, the published
status and the etcd upkeep's input read a snapshot, never a field another thread is
writing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from daemon.accounting import Action, Activity, IncidentLog, Kind, Ledger
from daemon.accounting.incident_events import refusal_of, take
from daemon.accounting.incidents import EtcdSeen, Refusal
from trainer.contracts import rank_events as events


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class RankProgress:
    step: int = 0
    # The job's reached step as etcd recorded it when this node's ranks last started (the
    # upkeep's answer): a start-over is seen after a restart of every node too.
    reached: int = 0
    loss: float | None = None
    participants: int | None = None
    largest_quorum: int = 0  # the most groups in any quorum this node's group committed in
    committed_steps: int = 0  # steps this node's group committed (every attempt's ranks)
    heals: int = 0
    started_over: int = 0  # times this node's group committed step 1 again (no state)
    started_over_from: int = 0  # the step the job had reached before the last of them
    last_heal_s: float | None = None
    rank_error: str | None = None  # the ranks' last rank_failed or bad_input error
    stragglers: Mapping[int, float] = field(default_factory=_empty)  # rank -> ratio, flagged
    train_done: Mapping[str, Any] | None = None
    latest_checkpoint: Mapping[str, Any] | None = None  # from a rank's checkpoint_saved
    invalid_checkpoints: frozenset[str] = frozenset()  # paths our ranks refused to load
    refusals: frozenset[Refusal] = frozenset()  # ... each as the save it was (incidents)
    # The highest step the job had reached before the ranks last started, as far as this
    # node knows (etcd's reached step, its own ranks' steps): a step committed up to it
    # is trained again (a cold restart, from a checkpoint or from step 0).
    redo_through: int = 0
    # Where the node's time went (daemon.accounting): its state's, and its ranks' steps.
    ledger: Ledger = field(default_factory=lambda: Ledger.begin(time.monotonic()))
    incidents: IncidentLog = field(default_factory=IncidentLog)  # its failures (accounting)

    def unreplicated(self, most_groups: int) -> dict[str, int] | None:
        """The numbers of a run in which other groups held slots (at most `most_groups` at
        once, as the upkeep read them) but this node's group never shared a quorum with
        any of them (it trained alone, or not at all); None otherwise."""
        if most_groups <= 1 or self.largest_quorum > 1:
            return None
        return {
            "groups_holding_slots": most_groups,
            "largest_quorum": self.largest_quorum,
            "committed_steps": self.committed_steps,
        }


MOST_LAG_S = 5.0  # a rank's clock further behind than this is not believed


def logged_ago(event: Mapping[str, Any], wall: float) -> float:
    """How long before `wall` (epoch s) the rank logged `event`, by its own time stamp
    (the same host's clock): the ledger closes a step where the rank ended it, not where
    the daemon's reader got to its line, so a late read does not move a step's quorum
    wait into the step before it. 0 where the event has no readable time."""
    stamp = event.get("time")
    if not wall or not isinstance(stamp, str):
        return 0.0
    try:
        logged = datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0
    return min(max(0.0, wall - logged), MOST_LAG_S)


def fold(
    p: RankProgress, event: Mapping[str, Any], node_id: str, now: float, wall: float = 0.0
) -> tuple[RankProgress, int | None]:
    """`p` with one rank event taken in at `now` (monotonic; `wall`: epoch s); and the step
    this node's group had reached when the event is a step 1 committed after it (the job
    started over from step 0: no checkpoint to load, no peer with state to heal from),
    else None."""
    name, new = event.get("event"), dict[str, Any]()
    lost_from = None
    if name in (events.TRAIN_STEP, events.STEP_ITEMS):  # a committed step, logged or not
        new["committed_steps"] = p.committed_steps + 1
        joined = event.get("participants")
        if isinstance(joined, int):
            new["largest_quorum"] = max(p.largest_quorum, joined)
        new["step"] = int(event.get("step", p.step))
        new["participants"] = event.get("participants")
    if name == events.TRAIN_STEP:
        before = p.step or p.reached  # before this daemon saw any step (it restarted): etcd's
        if new["step"] == 1 and before > 1:
            lost_from = before
            new |= {"started_over": p.started_over + 1, "started_over_from": before}
        new["loss"] = event.get("loss")
    elif name == events.HEAL_DONE:
        new |= {"heals": p.heals + 1, "last_heal_s": event.get("seconds")}
        new["step"] = int(event.get("step", p.step))
    elif name == events.TRAIN_DONE:
        new.update(train_done=MappingProxyType(dict(event)), step=int(event.get("step", p.step)))
    elif name == events.CHECKPOINT_INVALID:
        new["invalid_checkpoints"] = p.invalid_checkpoints | {str(event.get("path"))}
        new["refusals"] = p.refusals | {refusal_of(event)}
    elif name == events.CHECKPOINT_SAVED:
        new["invalid_checkpoints"] = p.invalid_checkpoints - {str(event.get("path"))}
        new["latest_checkpoint"] = MappingProxyType(
            {
                "step": event.get("step"),
                "path": event.get("path"),
                "time": event.get("time"),
                "node": node_id,
            }
        )
    elif name in (events.RANK_FAILED, events.BAD_INPUT):
        new["rank_error"] = str(event.get("error"))
    elif name in (events.STRAGGLER, events.STRAGGLER_CLEARED):
        rank, ratio = event.get("rank"), event.get("ratio")
        flagged = dict(p.stragglers)
        if isinstance(rank, int) and name == events.STRAGGLER:
            flagged[rank] = float(ratio) if isinstance(ratio, int | float) else 0.0
        elif isinstance(rank, int):
            flagged.pop(rank, None)
        new["stragglers"] = MappingProxyType(flagged)
    redo = max(p.redo_through, new.get("started_over_from", 0))  # (reached() set the first)
    ledger = p.ledger.event(now - logged_ago(event, wall), event, redo)
    if ledger is not p.ledger:
        new["ledger"] = ledger
    incidents = take(p.incidents, event, wall, p.participants or 1, p.refusals)
    if incidents is not p.incidents:
        new["incidents"] = incidents
    return (replace(p, **new) if new else p), lost_from


class ProgressFold:
    """The node group's fold of its ranks' events (called from their output threads)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._now = RankProgress(incidents=IncidentLog(node_id))

    def snapshot(self) -> RankProgress:
        return self._now  # one reference, swapped whole under the lock

    def track(self, event: Mapping[str, Any]) -> int | None:
        """Take in one rank event; the step the job had reached if it started over."""
        now, wall = time.monotonic(), time.time()
        with self._lock:
            self._now, lost_from = fold(self._now, event, self.node_id, now, wall)
        return lost_from

    def account(
        self, mode: Activity | None, etcd: EtcdSeen | None = None, group: int | None = None
    ) -> None:
        """The node's time goes to `mode` from now (None: its ranks' steps say), see
        daemon.accounting.Ledger.switch; `etcd`: what the last round saw of it (an outage
        or a partition: IncidentLog.etcd); `group`: the node's replica group."""
        p = self._now
        if mode == p.ledger.mode and etcd is None:
            return
        now, wall = time.monotonic(), time.time()
        with self._lock:
            p = self._now
            ledger = p.ledger.switch(now, mode)
            log = p.incidents
            if etcd is not None:
                log = log.etcd(wall, etcd, p.participants or 1, group, running=mode is None)
            if mode == Activity.SPARE:  # no group of its own left to recover
                log = log.left(wall)
            if ledger is not p.ledger or log is not p.incidents:
                self._now = replace(p, ledger=ledger, incidents=log)

    def struck(
        self,
        kind: Kind,
        detail: str,
        group: int | None,
        action: Action = Action.RESTART,
        began: float | None = None,
    ) -> None:
        """A failure of this node's own (its ranks failed or hung, a drain, its previous
        life lost): opened in the incident record now, with what is done about it."""
        wall = time.time()
        with self._lock:
            log = self._now.incidents.opened(kind, wall, began=began, group=group, detail=detail)
            self._now = replace(self._now, incidents=log.acted(action))

    def left(self) -> None:
        """The node leaves: its open incident, if any, ends now."""
        with self._lock:
            self._now = replace(self._now, incidents=self._now.incidents.left(time.time()))

    def reached(self, step: int | None) -> None:
        """The ranks start; `step`: the job's reached step as etcd recorded it (None:
        unread). What was reached before is the highest of it, the steps this node's ranks
        committed and what was reached before their last start."""
        with self._lock:
            p = self._now
            known = p.reached if step is None else step
            redo = max(p.redo_through, p.step, known)
            self._now = replace(p, reached=known, redo_through=redo)
