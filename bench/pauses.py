"""Pauses in a run, from the times (epoch s) of the commits one daemon logged: the one
reading of a failure's cost that bench/failover, ring_failover and spare_takeover share."""

from __future__ import annotations

import itertools
import math


def gaps(times: list[float], start: float, end: float = math.inf) -> list[tuple[float, float]]:
    """(begin, end) of each gap between consecutive commits that ends after `start` and
    begins before `end`: the gap that straddles `start` counts."""
    return [(a, b) for a, b in itertools.pairwise(times) if b > start and a < end]


def longest_gap(times: list[float], start: float, end: float = math.inf) -> tuple[float, float]:
    """(length, end) of the longest of :func:`gaps`; (0.0, start) where there is none."""
    return max(((b - a, b) for a, b in gaps(times, start, end)), default=(0.0, start))


def settled(times: list[float], start: float, within: float = 1.0) -> float:
    """When the steps after `start` are back to normal: the beginning of the first gap
    shorter than `within` that begins more than `within` after `start` (inf if none)."""
    return next(
        (a for a, b in gaps(times, start) if a > start + within and b - a < within), math.inf
    )
