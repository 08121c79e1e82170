"""The data contract's arithmetic: every item of a step exactly once, whoever takes part."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainer.data.shares import Quorum, fixed_cuts, group_share, rank_plan, split, step_items

# A step, its batch in whole units, the groups taking part, the micro-batch in units.
SIZES = {
    "step": st.integers(0, 1000),
    "units": st.integers(1, 64),
    "unit": st.integers(1, 4),
    "groups": st.integers(1, 9),
    "micro_units": st.integers(1, 5),
}


@given(**SIZES, dp=st.integers(1, 4), more=st.integers(0, 3))
def test_every_item_of_a_step_exactly_once_and_equal_micro_batch_counts(
    step: int, units: int, unit: int, groups: int, dp: int, micro_units: int, more: int
) -> None:
    batch = units * unit
    cuts = fixed_cuts(step, batch, groups + more, unit)  # the job may have more groups
    seen: list[int] = []
    weight = 0.0
    for rank in range(groups):
        share = group_share(step, batch, Quorum(groups, rank), unit)
        counts = set()
        for k in range(dp):
            plan = rank_plan(share, dp, k, micro_units * unit, groups, batch, unit, cuts)
            counts.add(len(plan.micro_batches))
            for micro, w in zip(plan.micro_batches, plan.weights, strict=True):
                assert len(micro) <= micro_units * unit and len(micro) % unit == 0
                assert not any(micro.start < c < micro.stop for c in cuts)
                assert abs(w - len(micro) * dp * groups / batch) < 1e-12
                seen.extend(micro)
                # what the averaging collectives do to this rank's weight
                weight += w / (dp * groups)
        assert len(counts) == 1  # the group's collectives match
    assert sorted(seen) == list(step_items(step, batch))
    assert abs(weight - 1.0) < 1e-9


@given(**SIZES)
def test_a_lone_group_runs_the_micro_batches_of_a_full_quorum(
    step: int, units: int, unit: int, groups: int, micro_units: int
) -> None:
    """Every item meets the parameters in a pass over the same items, whoever computes
    it; with two groups each pass's weight is the full quorum's halved, a power of two,
    so a lone group's gradients are the same bits as the two groups' average."""
    batch, micro = units * unit, micro_units * unit
    cuts = fixed_cuts(step, batch, groups, unit)
    full: list[tuple[range, float]] = []
    for rank in range(groups):
        share = group_share(step, batch, Quorum(groups, rank), unit)
        plan = rank_plan(share, 1, 0, micro, groups, batch, unit, cuts)
        full += [(m, w / groups) for m, w in zip(plan.micro_batches, plan.weights, strict=True)]
    alone = rank_plan(step_items(step, batch), 1, 0, micro, 1, batch, unit, cuts)
    lone = list(zip(alone.micro_batches, alone.weights, strict=True))
    assert [m for m, _ in lone] == [m for m, _ in full if m]
    for (_, w_lone), (_, w_full) in zip(lone, [f for f in full if f[0]], strict=True):
        assert w_lone == w_full if groups in (1, 2) else abs(w_lone - w_full) < 1e-12


def test_micro_batches_begin_at_the_full_quorums_shares() -> None:
    assert fixed_cuts(2, 10, 2) == (25,)
    assert fixed_cuts(0, 12, 3, unit=2) == (4, 8)
    assert fixed_cuts(5, 8, 1) == ()
    # a lone group of a two-group job: the other share in a pass of its own, even where
    # one pass could hold the whole step
    plan = rank_plan(range(20, 30), 1, 0, 10, 1, 10, cuts=fixed_cuts(2, 10, 2))
    assert plan.micro_batches == [range(20, 25), range(25, 30)]
    assert plan.weights == [0.5, 0.5]
    # a rank whose part spans a cut runs one pass more; its group-mate runs an empty one
    a = rank_plan(range(0, 8), 2, 0, 4, 1, 8, cuts=(2,))
    b = rank_plan(range(0, 8), 2, 1, 4, 1, 8, cuts=(2,))
    assert a.micro_batches == [range(0, 2), range(2, 4)]
    assert b.micro_batches == [range(4, 8), range(8, 8)] and b.weights[1] == 0.0


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
