"""bench/peer_paired.py: which cycles get a kill, and the paired goodput of kill cycles
against the kill-free cycles beside them (pure logic, made-up timelines)."""

from __future__ import annotations

import pytest

from bench.peer_measures import Commit, Kill
from bench.peer_paired import (
    Cycle,
    calm_rate,
    cycle_plan,
    kept_pairs,
    pair_ratios,
    paired_goodput,
)


def steady(start: float, end: float, every: float, first_step: int = 1) -> list[Commit]:
    n = round((end - start) / every)
    return [Commit(start + (i + 1) * every, first_step + i) for i in range(n)]


def cycles_of(plan: list[bool], length: float = 10.0) -> list[Cycle]:
    return [
        Cycle(i * length, (i + 1) * length, p, Kill(i * length, 0, (1,)) if p else None)
        for i, p in enumerate(plan)
    ]


def test_pairs_alternate_which_side_comes_first() -> None:
    assert cycle_plan(3) == [True, False, False, True, True, False]
    assert cycle_plan(0) == []


def test_a_kill_that_costs_two_seconds_of_one_group_in_every_kill_cycle() -> None:
    plan = cycle_plan(4)  # K Q Q K K Q Q K over 80 s, 10 s each
    cycles = cycles_of(plan)
    survivor = steady(0, 80, 0.5)
    # The killed group commits nothing in the first 2 s of each kill cycle.
    killed = [
        c
        for c in steady(0, 80, 0.5)
        if not any(k.start < c.t <= k.start + 2 for k in cycles if k.planned_kill)
    ]
    lines = {0: survivor, 1: killed}
    # Kill cycle: 20 + 16 commits; kill-free cycle: 20 + 20.
    assert pair_ratios(lines, cycles) == [pytest.approx(36 / 40)] * 4
    assert paired_goodput(lines, cycles) == pytest.approx(0.9)
    assert calm_rate(lines, cycles) == pytest.approx(2.0)


def test_a_machine_slowing_down_steadily_weighs_on_both_sides_alike() -> None:
    # No kill costs anything, but each commit does less work the later it comes (the
    # machine slows down linearly): a kill cycle that comes first in its pair looks
    # better than it is and one that comes second worse; alternating the order evens it out.
    cycles = cycles_of(cycle_plan(4))
    drifting = [Commit(c.t, c.step, 0.0, 1.0 - c.t / 160) for c in steady(0, 80, 0.5)]
    lines = {0: drifting, 1: list(drifting)}
    ratios = pair_ratios(lines, cycles)
    assert ratios[0] > 1.0 > ratios[1]
    assert paired_goodput(lines, cycles) == pytest.approx(1.0)


def test_a_pair_whose_kill_found_no_target_and_an_unfinished_pair_are_left_out() -> None:
    plan = cycle_plan(2)
    cycles = cycles_of(plan)
    cycles[3] = Cycle(30.0, 40.0, True, None)  # the second pair's kill did not happen
    cycles.append(Cycle(40.0, 50.0, True, Kill(40.0, 0, (1,))))  # a pair cut short
    assert [(k.start, c.start) for k, c in kept_pairs(cycles)] == [(0.0, 10.0)]
    survivor = steady(0, 50, 0.5)
    killed = [c for c in steady(0, 50, 0.5) if not 0 < c.t <= 5]
    lines = {0: survivor, 1: killed}
    assert paired_goodput(lines, cycles) == pytest.approx(30 / 40)


def test_one_world_counts_its_net_progress_so_steps_redone_cost_twice() -> None:
    # torchrun: at t=0 the world restarts from step 0 to step -4 relative (back 4 steps)
    # and is down for 2 s; kill-free cycle: 10 steps.
    cycles = [Cycle(0.0, 10.0, True, Kill(0.0, 0, (1,))), Cycle(10.0, 20.0, False)]
    before = [Commit(-1.0, 20)]
    restarted = [Commit(2.0 + i, 16 + i) for i in range(1, 19)]
    lines = {0: [*before, *restarted]}
    # Net progress in the kill cycle: step 24 at t=10 - step 20 at t=0 = 4; then 10.
    assert paired_goodput(lines, cycles) == pytest.approx(4 / 10)
