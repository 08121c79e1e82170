"""Every second of a node, attributed to exactly one activity: a value, advanced by the
supervisor's state and by its ranks' step events.

The ledger holds the seconds credited so far and one open interval, from ``since`` to
now. What the open interval is depends on the mode:

- a fixed activity (the node joins, waits, is fenced, restarts its ranks): the interval
  is that activity's, and a reading includes it;
- ``None``, the ranks run: the interval belongs to the step in flight, and only the
  step's end says what it was. Local rank 0 logs every step's end (committed, skipped,
  abandoned), with the step's seconds, the part of them it waited for its quorum, and
  the seconds the loop spent on a checkpoint save and an evaluation before it where
  there is something to say (``trainer.contracts.rank_events``; a step's end without
  them is all step); a heal says how long the peer's state took. A reading leaves this
  interval out until then, so the counters never go back. The ranks' ``train_done`` (or
  ``train_stopped``) says their steps are over: what came after the last one (the final
  save, the digest) and what follows until they exit is the job's end, draining.

The seconds of the ledger always add up to its life: each credit closes the open
interval and opens the next at the same instant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from daemon.accounting.activities import INDEX, ORDER, Activity
from trainer.contracts import rank_events as events

STEP_ENDS = frozenset({events.TRAIN_STEP, events.STEP_ITEMS})
THROWN_AWAY = frozenset({events.STEP_SKIPPED, events.STEP_ABANDONED})
# The ranks' last words: they took their last step, and saved it (the job's end, a drain).
LEFT = frozenset({events.TRAIN_DONE, events.TRAIN_STOPPED})


def _seconds(event: Mapping[str, Any], name: str) -> float:
    value = event.get(name)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


@dataclass(frozen=True)
class Ledger:
    since: float  # monotonic: the start of the open interval
    seconds: tuple[float, ...] = (0.0,) * len(ORDER)  # closed seconds, in ORDER
    mode: Activity | None = Activity.WAITING  # None: the ranks run (their events decide)
    stepped: bool = False  # a step of the running ranks has ended (else they are starting)
    # Seconds of the step in flight before a fence paused it: its end says what they were
    # (a step that commits after the fence is lifted, or one lost or skipped).
    held: float = 0.0
    # The ranks said their steps are over (train_done, train_stopped): until they exit,
    # while the node still shows them running, its time is the job's end (draining).
    left: bool = False

    @classmethod
    def begin(cls, now: float) -> Ledger:
        return cls(since=now)

    def totals(self, now: float) -> dict[Activity, float]:
        """Seconds per activity: the closed ones, and the open interval where its activity
        is known (a fixed mode); a step in flight is counted once it ends."""
        out = dict(zip(ORDER, self.seconds, strict=True))
        if self.mode is not None:
            out[self.mode] += max(0.0, now - self.since)
        return out

    def in_flight(self, now: float) -> float:
        """The seconds of the step in flight, not yet in :meth:`totals`: what ran of it
        before a fence, and since (none while the node's mode is fixed)."""
        return self.held + (max(0.0, now - self.since) if self.mode is None else 0.0)

    def pending(self) -> Activity:
        """What the ranks' open interval is until a step ends: their start, or a step."""
        return Activity.TRAINING if self.stepped else Activity.RESTARTING

    def switch(self, now: float, mode: Activity | None) -> Ledger:
        """The node moved to `mode` (None: its ranks run) at `now`. A step in flight when
        the ranks stop for a restart is lost; one in flight at a drain is counted as it
        would have ended; a fence pauses it (held): its end says, after the fence, or it
        is lost with the ranks the fence stops."""
        if mode == self.mode or (mode is None and self.left):
            return self
        if self.mode is None and mode == Activity.FENCED:  # the step is held, not ended
            held = self.held + max(0.0, now - self.since)
            return replace(self, since=max(now, self.since), held=held, mode=mode)
        if self.mode is not None:
            closed = self._credit(now, (), self.mode, flight=False)
            if mode is not None and closed.held:  # the held step's ranks are stopped
                closed = closed._credit(now, (), Activity.DISCARDED)
        else:
            lost = mode == Activity.RESTARTING
            closed = self._credit(now, (), Activity.DISCARDED if lost else self.pending())
        if mode is None:  # ranks start, or resume after a fence where they were paused
            return replace(closed, mode=None, stepped=self.stepped and self.mode == Activity.FENCED)
        return replace(closed, mode=mode, left=False)

    def event(self, now: float, event: Mapping[str, Any], redo_through: int) -> Ledger:
        """A rank event at `now`; `redo_through`: the step the job had reached before a
        cold restart (a committed step up to it is one trained again)."""
        if self.mode is not None:
            return self  # the ranks' last words as they stop or drain: the node's mode
        name = event.get("event")
        if name == events.HEAL_DONE:
            took = _seconds(event, "seconds")
            span = self.held + max(0.0, now - self.since)
            return self._credit(now, ((self.pending(), span - took),), Activity.HEALING)
        if name in STEP_ENDS:
            step = event.get("step")
            redone = isinstance(step, int) and step <= redo_through
            return self._step_end(now, event, Activity.DISCARDED if redone else Activity.TRAINING)
        if name in THROWN_AWAY:
            return self._step_end(now, event, Activity.DISCARDED)
        if name in LEFT:  # since the last step: the final save and the leaving, no step
            closed = self._credit(now, (), Activity.DRAINING)
            return replace(closed, mode=Activity.DRAINING, left=True)
        return self

    def _step_end(self, now: float, event: Mapping[str, Any], rest: Activity) -> Ledger:
        """A step ended at `now`. The open interval is, in the order it went: the loop's
        save and evaluation after the last step, its other work between steps (or, before
        the ranks' first step, their start), then this step: its quorum wait, then the
        step itself (`rest`). A step that began before the interval (a heal in it was
        credited already, as part of the quorum wait) has that part taken off its
        quorum wait. Without the step's seconds, the interval is the step."""
        span = self.held + max(0.0, now - self.since)
        step = _seconds(event, events.STEP_SECONDS) or span
        gap, earlier = max(0.0, span - step), max(0.0, step - span)
        saved = min(_seconds(event, events.CHECKPOINT_S), gap)
        evaluated = min(_seconds(event, events.EVAL_S), gap - saved)
        parts = (
            (Activity.CHECKPOINT, saved),
            (Activity.EVALUATING, evaluated),
            (self.pending(), gap - saved - evaluated),
            (Activity.QUORUM, _seconds(event, events.QUORUM_S) - earlier),
        )
        return replace(self._credit(now, parts, rest), stepped=True)

    def _credit(
        self,
        now: float,
        parts: Sequence[tuple[Activity, float]],
        rest: Activity,
        flight: bool = True,
    ) -> Ledger:
        """Close the open interval at `now` (with the held part of the step in flight,
        unless not `flight`: a fixed mode's own interval): each of `parts` its seconds
        from the front (no more than is left), the rest to `rest`."""
        left = max(0.0, now - self.since) + (self.held if flight else 0.0)
        seconds = list(self.seconds)
        for activity, took in parts:
            share = min(max(0.0, took), left)
            seconds[INDEX[activity]] += share
            left -= share
        seconds[INDEX[rest]] += left
        held = 0.0 if flight else self.held
        return replace(self, since=max(now, self.since), seconds=tuple(seconds), held=held)


def time_document(ledger: Ledger, now: float) -> dict[str, Any]:
    """The node's time for /status: its goodput, the seconds by activity and the step in
    flight (which the activities will take once it ends)."""
    totals = ledger.totals(now)
    share = goodput(totals)
    return {
        "goodput": None if share is None else round(share, 4),
        "seconds": {a.value: round(s, 3) for a, s in totals.items()},
        "in_flight_s": round(ledger.in_flight(now), 3),
    }


def goodput(totals: Mapping[Activity, float]) -> float | None:
    """The share of the time that went to committed steps (None before any time passed)."""
    whole = sum(totals.values())
    return totals.get(Activity.TRAINING, 0.0) / whole if whole > 0 else None
