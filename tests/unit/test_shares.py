"""The data contract's arithmetic: every item of a step exactly once, whoever takes part."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainer.data.shares import Quorum, group_share, rank_plan, split, step_items


@given(
    step=st.integers(0, 1000),
    units=st.integers(1, 64),
    unit=st.integers(1, 4),
    groups=st.integers(1, 9),
    dp=st.integers(1, 4),
    micro_units=st.integers(1, 5),
)
def test_every_item_of_a_step_exactly_once_and_equal_micro_batch_counts(
    step: int, units: int, unit: int, groups: int, dp: int, micro_units: int
) -> None:
    batch = units * unit
    seen: list[int] = []
    weight = 0.0
    for rank in range(groups):
        share = group_share(step, batch, Quorum(groups, rank), unit)
        counts = set()
        for k in range(dp):
            plan = rank_plan(share, dp, k, micro_units * unit, groups, batch, unit)
            counts.add(len(plan.micro_batches))
            for micro, w in zip(plan.micro_batches, plan.weights, strict=True):
                assert len(micro) <= micro_units * unit and len(micro) % unit == 0
                assert abs(w - len(micro) * dp * groups / batch) < 1e-12
                seen.extend(micro)
                # what the averaging collectives do to this rank's weight
                weight += w / (dp * groups)
        assert len(counts) == 1  # the group's collectives match
    assert sorted(seen) == list(step_items(step, batch))
    assert abs(weight - 1.0) < 1e-9


def test_a_healing_group_takes_nothing_but_still_runs_one_pass() -> None:
    share = group_share(3, 16, Quorum(participants=2, rank=None))
    assert len(share) == 0
    plan = rank_plan(share, 2, 1, 4, 2, 16)
    assert [len(m) for m in plan.micro_batches] == [0]
    assert plan.weights == [0.0]


def test_shares_are_contiguous_and_follow_the_participants() -> None:
    assert [group_share(2, 10, Quorum(2, r)) for r in range(2)] == [range(20, 25), range(25, 30)]
    assert [group_share(2, 10, Quorum(3, r)) for r in range(3)] == [
        range(20, 23),
        range(23, 26),
        range(26, 30),
    ]
    assert group_share(2, 10, Quorum(1, 0)) == range(20, 30)
    # a pipelined group cuts whole schedule batches of 4
    assert [split(range(0, 12), 2, r, 4) for r in range(2)] == [range(0, 4), range(4, 12)]
