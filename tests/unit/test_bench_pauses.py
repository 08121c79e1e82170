"""bench/pauses.py: the pauses the failover benches report, on commit times made here."""

from __future__ import annotations

import math

from bench.pauses import gaps, longest_gap, settled
from bench.ring_failover import pause_over

# Commits every 0.1 s, a 2.5 s pause from 10.0, a slow 1.2 s step while recovering, then
# normal again; later a 3 s pause that a kill at 10.05 did not cause.
TIMES = [9.8, 9.9, 10.0, 12.5, 13.7, 13.8, 13.9, 14.0, 17.0, 17.1]


def test_the_gap_that_straddles_the_start_counts() -> None:
    assert gaps(TIMES, 10.05, 12.6) == [(10.0, 12.5), (12.5, 13.7)]
    assert longest_gap(TIMES, 10.05, 12.6) == (2.5, 12.5)


def test_without_a_gap_in_the_window_nothing_paused() -> None:
    assert longest_gap(TIMES, 20.0) == (0.0, 20.0)


def test_the_steps_settle_at_the_first_short_gap_a_second_past_the_start() -> None:
    assert settled(TIMES, 10.05) == 13.7
    assert settled([1.0, 5.0], 1.5) == math.inf


def test_the_ring_bench_counts_the_pause_up_to_the_settling_and_no_later() -> None:
    assert pause_over(TIMES, 10.05) == 2.5  # the 3 s pause at 14.0 came after it settled
    assert longest_gap(TIMES, 10.05)[0] == 3.0
