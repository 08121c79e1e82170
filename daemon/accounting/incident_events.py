"""What a rank event means for the node's incident record (daemon.accounting.incidents)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemon.accounting.incidents import Action, IncidentLog, Kind, Refusal, refusal
from trainer.contracts import rank_events as events
from trainer.contracts.checkpoint_names import NO_MARKER

STEP_ENDS = frozenset({events.TRAIN_STEP, events.STEP_ITEMS})
# Events that are a failure of their own: the kind, and the field that says why.
STRIKES: dict[str, tuple[Kind, str]] = {
    events.CHECKPOINT_INVALID: (Kind.CHECKPOINT, "reason"),
    events.CHECKPOINT_FAILED: (Kind.CHECKPOINT, "error"),
    events.STEP_NOT_FINITE: (Kind.NON_FINITE, "loss"),
    events.REPLICAS_DIVERGED: (Kind.DIVERGENCE, "group"),
}


def take(
    log: IncidentLog,
    event: Mapping[str, Any],
    now: float,
    groups: int,
    refused: frozenset[Refusal] = frozenset(),
) -> IncidentLog:
    """`log` with one rank event taken in at `now` (epoch s); `groups`: the groups in the
    node's last quorum (the ones a cold restart stopped); `refused`: the saves its ranks
    refused before (:data:`Refusal`; one refused again is no new failure: a cold restart
    that finds it newest is the ranks' failure, not the checkpoint's; the same step saved
    again since, by any node, is another checkpoint)."""
    name = event.get("event")
    if name == events.CHECKPOINT_INVALID and not _failed(event, refused):
        return log
    if name in STEP_ENDS:
        return log.committed(now)
    if name == events.HEAL_DONE:
        return log.acted(Action.HEAL)
    if name == events.CHECKPOINT_LOADED and log.open is not None:
        # No peer had state: every group resumed from a checkpoint after one failure, which
        # each node records; read back, the records of it are one (incident_store.py).
        return log.acted(Action.COLD_RESTART).struck(groups)
    if name in STRIKES:
        kind, field = STRIKES[str(name)]
        which = refusal_of(event) if name == events.CHECKPOINT_INVALID else ("", None)
        return log.opened(kind, now, detail=str(event.get(field, ""))[:200], checkpoint=which)
    return log


def refusal_of(event: Mapping[str, Any]) -> Refusal:
    """Which save a ``checkpoint_invalid`` refused: its path and its marker's time."""
    return refusal(str(event.get("path", "")), event.get("saved"))


def _failed(event: Mapping[str, Any], refused: frozenset[Refusal]) -> bool:
    """Whether a ``checkpoint_invalid`` is a checkpoint's failure: one refused at load for
    what it holds (corrupt, unreadable, another layout's), not refused before. A partial
    one (no completion marker) is what is left of a save that a failure cut short, and
    that failure was recorded when it happened (a rank killed mid-save: its exit); found
    at a load or by a later save's retention scan (``deleted: false``, nobody loading it)
    it is no new failure, and would take the kind of the cold restart it is found in."""
    partial = event.get("reason") == NO_MARKER
    scan = event.get("deleted") is False
    return not partial and not scan and refusal_of(event) not in refused
