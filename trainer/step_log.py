"""The step log: what a node's first rank says after each step attempt (`train_step`,
`step_items`, `step_skipped`), the daemon's view of the ranks' progress, their data
accounting and where their time went (daemon.accounting)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trainer import logs
from trainer.contracts import rank_events as events
from trainer.step_report import StepReport

NOTHING: Mapping[str, float] = MappingProxyType({})
# A quorum wait shorter than this is a failure-free step's round trip: not worth a field.
QUORUM_MIN_S = 0.001


class StepLogger:
    """Emits `train_step` (committed) and `step_skipped` (not committed) events. Where the
    loop's time went besides the step (the daemon's goodput: daemon.accounting) rides on
    them only when there is something to say: the rank's first step (what came before it
    was its start), a wait for the quorum, or a save or an evaluation since the last step
    (:meth:`spent`); then with the step's own seconds. A failure-free step's event is
    what it was."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.log = logs.get()
        self.besides: dict[str, float] = {}  # field -> seconds, since the last event
        self.first = True  # no step ended yet in this rank

    def spent(self, field: str, seconds: float) -> None:
        """The loop spent `seconds` on `field` (CHECKPOINT_S, EVAL_S) after a step."""
        self.besides[field] = self.besides.get(field, 0.0) + seconds

    def __call__(self, r: StepReport) -> None:
        quiet = r.quorum_s < QUORUM_MIN_S and not self.besides and not self.first
        times = NOTHING if quiet else self._times(r)
        if not r.committed:
            self.log.warning(events.STEP_SKIPPED, step=r.step, participants=r.participants, **times)
            return
        # The data accounting: the items of every committed step, in train_step or alone.
        items = [r.items.start, r.items.stop]
        if r.step % self.every == 0 or r.step == 1:
            self.log.info(
                events.TRAIN_STEP,
                step=r.step,
                items=items,
                loss=None if r.loss is None else round(r.loss, 6),
                lr=r.lr,
                grad_norm=round(r.grad_norm, 6),
                tokens_per_s=round(r.tokens / r.seconds, 1) if r.seconds > 0 else None,
                participants=r.participants,
                **{events.STEP_SECONDS: round(r.seconds, 4), **times},
            )
        elif not quiet:
            self.log.info(
                events.STEP_ITEMS, step=r.step, items=items, participants=r.participants, **times
            )
        else:  # a failure-free step, the hot path: the event as it always was
            self.log.info(events.STEP_ITEMS, step=r.step, items=items, participants=r.participants)

    def _times(self, r: StepReport) -> dict[str, float]:
        """The step's seconds, its quorum wait and what the loop spent since the last."""
        self.first = False
        times = {events.STEP_SECONDS: round(r.seconds, 4)}
        if r.quorum_s >= QUORUM_MIN_S:
            times[events.QUORUM_S] = round(r.quorum_s, 4)
        if self.besides:
            times.update((k, round(v, 4)) for k, v in self.besides.items())
            self.besides = {}
        return times
