"""The straggler check's arithmetic (trainer/ft/straggler.py): a rank compares its
compute with the other groups' mean, recovered from the average over all groups."""

from __future__ import annotations

import torch

from trainer.config import FaultToleranceConfig
from trainer.ft.straggler import ComputeClock, StragglerWatch


def _watch(factor: float = 1.5, steps: int = 5) -> StragglerWatch:
    return StragglerWatch(FaultToleranceConfig(straggler_factor=factor, straggler_steps=steps), 0)


def test_a_rank_three_times_slower_is_flagged_once_its_window_is_full() -> None:
    w = _watch()
    # Two groups: this rank 0.3 s, the other 0.1 s, so the mean is 0.2 s.
    verdicts = [w.observe(0.3, 0.2, 2) for _ in range(5)]
    assert verdicts[:4] == [None] * 4
    last = verdicts[4]
    assert last is not None and last.straggler
    assert abs(last.others_s - 0.1) < 1e-9 and abs(last.ratio - 3.0) < 1e-9
    assert w.observe(0.3, 0.2, 2) is None  # no change, no second event


def test_the_fast_groups_are_not_flagged_and_a_recovered_rank_is_cleared() -> None:
    fast = _watch()
    assert all(fast.observe(0.1, 0.2, 2) is None for _ in range(10))
    assert not fast.flagged and fast.last_ratio is not None and fast.last_ratio < 1
    slow = _watch()
    for _ in range(5):
        slow.observe(0.3, 0.2, 2)
    assert slow.flagged
    changes = [slow.observe(0.1, 0.1, 2) for _ in range(5)]
    cleared = [v for v in changes if v is not None]
    assert len(cleared) == 1 and not cleared[0].straggler


def test_one_slow_step_does_not_make_a_straggler() -> None:
    w = _watch()
    steps = [(0.1, 0.1)] * 4 + [(1.0, 0.55)] + [(0.1, 0.1)] * 4
    assert all(w.observe(own, mean, 2) is None for own, mean in steps)


def test_with_four_groups_the_others_mean_excludes_this_rank() -> None:
    w = _watch(factor=2.0, steps=1)
    # Others at 0.1 s each, this rank 0.4 s: mean (0.4 + 0.3) / 4.
    v = w.observe(0.4, 0.7 / 4, 4)
    assert v is not None and v.straggler and abs(v.others_s - 0.1) < 1e-9


def test_alone_or_turned_off_nothing_is_compared() -> None:
    assert _watch(steps=1).observe(0.3, 0.3, 1) is None
    assert _watch(factor=0, steps=1).observe(0.3, 0.1, 2) is None


def test_the_cpu_clock_leaves_out_the_time_waited_on_other_groups() -> None:
    clock = ComputeClock(torch.device("cpu"))
    clock.start()
    sum(range(200_000))
    whole = clock.stop(0.0)
    clock.start()
    assert whole is not None and whole > 0 and clock.stop(10.0) == 0.0
