"""What a step's end tells the daemon of where the loop's time went (trainer/run.py's
StepLogger; the daemon's ledger reads it: test_time_ledger.py)."""

from __future__ import annotations

from structlog.testing import capture_logs

from trainer.contracts import rank_events as events
from trainer.step_log import StepLogger
from trainer.step_report import StepReport


def report(step: int, committed: bool = True, quorum_s: float = 0.0) -> StepReport:
    return StepReport(
        step=step,
        committed=committed,
        loss=1.0,
        lr=0.1,
        grad_norm=1.0,
        participants=2,
        quorum_id=1,
        seconds=0.25,
        tokens=8,
        items=range(0, 4) if committed else range(0),
        quorum_s=quorum_s,
    )


def test_a_step_end_says_where_the_time_went_only_when_there_is_something_to_say() -> None:
    with capture_logs() as said:
        log = StepLogger(every=10)
        log(report(1, quorum_s=0.05))  # the rank's first step, logged in full
        log.spent(events.CHECKPOINT_S, 1.5)
        log.spent(events.EVAL_S, 0.5)
        log.spent(events.CHECKPOINT_S, 0.25)
        log(report(1, committed=False))  # skipped: retried
        log(report(2, quorum_s=0.0004))  # failure-free: a quorum round trip
        log(report(3, quorum_s=0.2))  # waited for a quorum
        log(report(10))  # a full train_step keeps its step_seconds
    first, skipped, quiet, waited, full = said
    assert first["event"] == events.TRAIN_STEP
    assert (first[events.STEP_SECONDS], first[events.QUORUM_S]) == (0.25, 0.05)
    assert skipped["event"] == events.STEP_SKIPPED
    assert skipped[events.STEP_SECONDS] == 0.25
    assert (skipped[events.CHECKPOINT_S], skipped[events.EVAL_S]) == (1.75, 0.5)
    times = {events.STEP_SECONDS, events.QUORUM_S, events.CHECKPOINT_S, events.EVAL_S}
    assert quiet["event"] == events.STEP_ITEMS and not times & set(quiet)
    assert (waited[events.STEP_SECONDS], waited[events.QUORUM_S]) == (0.25, 0.2)
    assert full["event"] == events.TRAIN_STEP and full[events.STEP_SECONDS] == 0.25
    assert not {events.QUORUM_S, events.CHECKPOINT_S, events.EVAL_S} & set(full)
