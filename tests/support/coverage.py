"""The data accounting of the coverage tests: the items of each committed step, as the
groups logged them (``train_step`` and ``step_items`` events), checked against the
shares of the step's quorum."""

from __future__ import annotations

from tests.support.harness import Event
from trainer.data.shares import Quorum, group_share

BATCH = 10  # the coverage jobs' global batch


def accounting(events: list[Event]) -> list[Event]:
    return [e for e in events if e["event"] in ("train_step", "step_items")]


def check_step(step: int, logged: list[Event], batch: int = BATCH) -> tuple[set[int], int]:
    """The items committed step `step` trained on, from the groups that logged it, and how
    many of its shares nobody logged. Each logged range is its group's share under the
    step's quorum; a share nobody logged (its group died after the step's all-reduce,
    before it could log: the callers allow one per kill) is taken from that quorum."""
    participants = {int(e["participants"]) for e in logged}
    assert len(participants) == 1, (step, logged)
    (count,) = participants
    shares = [group_share(step - 1, batch, Quorum(count, r)) for r in range(count)]
    ranges = [range(*e["items"]) for e in logged if e["items"][0] != e["items"][1]]
    assert all(r in shares for r in ranges), (step, ranges, shares)
    assert len(set(ranges)) == len(ranges), f"step {step}: a share was trained twice"
    return {i for r in shares for i in r}, count - len(ranges)
