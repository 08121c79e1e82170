"""Paired goodput for bench/peers.py (``--paired N``): the work a system does in the
``--kill-every`` seconds after a SIGKILL, over the work it does in as many seconds
without one, taken next to each other. The measures are pure functions of timestamps;
:func:`run_paired` and :func:`paired` drive the systems.

The main goodput divides a 240 s chaos window's work by a failure-free rate measured
before and after it; this machine's speed drifts by several per cent between those
windows, which moves that figure by more than a kill costs. Here every kill cycle has a
kill-free cycle beside it, and the pairs alternate their order (kill first, then kill-free
first, ...), so a steady drift weighs on both sides alike. What it measures is the same
quantity, a kill every ``--kill-every`` seconds against no kill, with the failure-free
reference taken from the minutes around each kill rather than from the ends of the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.peer_measures import (
    Commit,
    Kill,
    KillMeasure,
    count_between,
    measure_kill,
    median_or_none,
    useful,
)
from bench.peer_phases import (
    estimate_s,
    every_run,
    kill_now,
    make,
    report_failed,
    run_until,
    say,
    wait_quiet,
    wait_ready,
)


def cycle_plan(pairs: int) -> list[bool]:
    """Which cycles start with a kill: pair i is (kill, kill-free) for even i and
    (kill-free, kill) for odd i."""
    plan: list[bool] = []
    for i in range(pairs):
        plan += [True, False] if i % 2 == 0 else [False, True]
    return plan


@dataclass(frozen=True)
class Cycle:
    start: float
    end: float
    planned_kill: bool
    kill: Kill | None = None  # None in a kill cycle: no live target was found in time


def kept_pairs(cycles: Sequence[Cycle]) -> list[tuple[Cycle, Cycle]]:
    """(kill cycle, kill-free cycle) of each complete pair whose kill happened."""
    out: list[tuple[Cycle, Cycle]] = []
    for i in range(0, len(cycles) - 1, 2):
        pair = cycles[i : i + 2]
        killed = [c for c in pair if c.planned_kill]
        calm = [c for c in pair if not c.planned_kill]
        if len(killed) == 1 and len(calm) == 1 and killed[0].kill is not None:
            out.append((killed[0], calm[0]))
    return out


def _work(timelines: dict[int, list[Commit]], cycle: Cycle) -> float:
    return useful(timelines, cycle.start, cycle.end)


def pair_ratios(timelines: dict[int, list[Commit]], cycles: Sequence[Cycle]) -> list[float]:
    """Each kept pair's useful work with the kill over that without it (a pair whose
    kill-free cycle did no work is left out)."""
    pairs = [(_work(timelines, k), _work(timelines, c)) for k, c in kept_pairs(cycles)]
    return [k / c for k, c in pairs if c > 0]


def paired_goodput(timelines: dict[int, list[Commit]], cycles: Sequence[Cycle]) -> float | None:
    """Useful work of the kept pairs' kill cycles over that of their kill-free cycles
    (pooled: each pair weighs as much as its work)."""
    pairs = kept_pairs(cycles)
    calm = sum(_work(timelines, c) for _, c in pairs)
    return sum(_work(timelines, k) for k, _ in pairs) / calm if calm > 0 else None


def calm_rate(timelines: dict[int, list[Commit]], cycles: Sequence[Cycle]) -> float:
    """The mean group's committed steps per second over the kill-free cycles."""
    calm = [c for c in cycles if not c.planned_kill]
    seconds = sum(c.end - c.start for c in calm)
    if seconds <= 0 or not timelines:
        return 0.0
    return statistics.fmean(
        sum(count_between(cs, c.start, c.end) for c in calm) / seconds for cs in timelines.values()
    )


@dataclass
class PairedResult:
    """One paired run of one system."""

    system: str
    goodput: float | None  # paired_goodput
    pairs: list[float]  # pair_ratios
    kills: list[KillMeasure]
    calm_steps_per_s: float  # the mean group's steps/s in the kill-free cycles
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def summary(runs: Sequence[PairedResult]) -> dict[str, Any]:
    """Pooled over a system's runs: the median run's paired goodput, every pair's ratio
    (min/median/max) and the kills' recovery and pause medians."""
    pairs = [p for r in runs for p in r.pairs]
    kills = [k for r in runs for k in r.kills]
    return {
        "goodput": median_or_none(r.goodput for r in runs),
        "runs": [r.goodput for r in runs],
        "pairs": len(pairs),
        "pair_min": min(pairs) if pairs else None,
        "pair_median": statistics.median(pairs) if pairs else None,
        "pair_max": max(pairs) if pairs else None,
        "recovery_s": median_or_none(k.recovery_s for k in kills),
        "pause_s": median_or_none(k.pause_s for k in kills),
        "calm_steps_per_s": median_or_none(r.calm_steps_per_s for r in runs),
    }


def print_paired(runs: dict[str, list[PairedResult]]) -> dict[str, Any]:
    """Print each system's paired figures (:func:`summary`) as a table; return them."""
    table = {name: summary(rs) for name, rs in runs.items() if rs}
    print("\npaired goodput (work in the kill cycles / work in the kill-free cycles beside them):")
    print(
        f"{'system':<14}{'goodput':>9}{'pairs':>7}{'pair.min':>10}{'pair.med':>10}"
        f"{'pair.max':>10}{'recovery':>10}{'pause':>8}{'calm st/s':>11}"
    )
    for name, s in table.items():
        cells = [
            s["goodput"],
            s["pairs"],
            s["pair_min"],
            s["pair_median"],
            s["pair_max"],
            s["recovery_s"],
            s["pause_s"],
            s["calm_steps_per_s"],
        ]
        widths = [9, 7, 10, 10, 10, 10, 8, 11]
        text = "".join(
            f"{'-':>{w}}" if v is None else (f"{v:>{w}d}" if isinstance(v, int) else f"{v:>{w}.3f}")
            for v, w in zip(cells, widths, strict=True)
        )
        print(f"{name:<14}{text}")
    return table


def run_paired(name: str, workdir: Path, args: argparse.Namespace, tag: str) -> PairedResult:
    """One paired run (bench/peer_paired.py): after the warm-up, --paired pairs of
    --kill-every second cycles, one with a SIGKILL at its start and one without."""
    system = make(name, workdir, args)
    try:
        system.start()
        ready = wait_ready(system, args.start_timeout)
        system.t0 = ready
        start = wait_quiet(system, ready + args.warmup, args, tag)
        cycles: list[Cycle] = []
        for planned in cycle_plan(args.paired):
            kill = kill_now(system, len(cycles) // 2, args.kill_every / 2) if planned else None
            if planned and kill is None:
                say(f"  [{tag}] cycle {len(cycles) + 1}: no live target, kill skipped")
            start = kill.t if kill is not None else max(start, time.time())
            run_until(system, start + args.kill_every)
            cycles.append(Cycle(start, start + args.kill_every, planned, kill))
            start += args.kill_every
        system.poll()
        horizon = time.time()
    finally:
        system.stop()
    lines = system.timelines
    kills = [c.kill for c in cycles if c.kill is not None]
    result = PairedResult(
        name,
        paired_goodput(lines, cycles),
        pair_ratios(lines, cycles),
        [measure_kill(lines, k, horizon, system.milestones) for k in kills],
        calm_rate(lines, cycles),
        system.notes,
    )
    say(
        f"  [{tag}] paired goodput {result.goodput or 0:.4f}; pairs "
        + " ".join(f"{r:.3f}" for r in result.pairs)
    )
    return result


def paired(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--paired: every system's paired runs, interleaved over --repeats."""
    say(
        f"paired: {args.repeats} run(s) per system, each {args.paired} pairs of {args.kill_every:g} s"
        f" cycles (a SIGKILL at the start of one, none in the other) after {args.warmup:g} s warm-up"
    )
    say(f"expected duration: about {estimate_s(args) / 60:.0f} min")
    failed: list[str] = []
    runs = every_run(root, args, run_paired, failed)
    table = print_paired(runs)
    report_failed(args, failed)
    return {
        "paired": table,
        "paired_runs": {n: [r.as_json() for r in rs] for n, rs in runs.items()},
        "failed": failed,
    }
