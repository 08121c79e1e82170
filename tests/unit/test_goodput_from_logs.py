"""The random-fault test's second count of goodput, from the logs alone
(tests/support/accounting_checks.py): a redone step is one the job had reached before a
cold restart, whichever node trained it, as the daemons count `discarded`."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.support.accounting_checks import logged_training
from tests.support.harness import Event

EPOCH = 1_000_000_000.0


def ev(t: float, kind: str, **fields: object) -> Event:
    stamp = datetime.fromtimestamp(EPOCH + t, UTC).isoformat().replace("+00:00", "Z")
    return {"event": kind, "time": stamp, **fields}


def steps(t0: float, first: int, last: int) -> list[Event]:
    """One-second steps `first`..`last`, the first ending a second after `t0`."""
    return [
        ev(t0 + s - first + 1, "train_step", step=s, step_seconds=1.0)
        for s in range(first, last + 1)
    ]


def test_a_start_over_from_nothing_redoes_what_the_job_had_reached() -> None:
    """Both nodes trained 1..5, lost their ranks, and started over from step 1 (no
    checkpoint): 1..5 again are redone, 6 and 7 are new."""
    a = [ev(0, "group_started"), *steps(0, 1, 5), ev(20, "group_restarted"), *steps(20, 1, 7)]
    b = [ev(0.01, "group_started"), *steps(0.01, 1, 5), ev(20.01, "group_restarted")]
    b += steps(20.01, 1, 7)
    assert logged_training([("a", a), ("b", b)]) == {"a": 7.0, "b": 7.0}


def test_a_step_first_trained_by_one_node_is_redone_for_every_node_after_a_load() -> None:
    """Node d was stopped while c trained 2..5; after a cold restart from the step-2
    checkpoint, 3..5 are redone for d too, though d never trained them before."""
    c = [ev(0, "group_started"), *steps(0, 1, 5), ev(19.5, "group_restarted")]
    c += [ev(19.9, "checkpoint_loaded", step=2), *steps(20, 3, 7)]
    d = [ev(0.01, "group_started"), *steps(0.01, 1, 1), ev(19.5, "group_restarted")]
    d += [ev(19.91, "checkpoint_loaded", step=2), *steps(20.01, 3, 7)]
    assert logged_training([("c", c), ("d", d)]) == {"c": 7.0, "d": 3.0}
