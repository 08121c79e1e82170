"""The measures of bench/peers.py, as pure functions of timestamps (no processes, no torch).

A run gives, per group (the DDP world is one group), its committed steps as
:class:`Commit` records (wall time, step, and when the committing process was
born), milestones of its restarts as ``(time, label)`` pairs, and the kills the
benchmark made as :class:`Kill` records. Everything below reads those only.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

# Survivor commits after the killed group's recovery that the pause interval still covers.
PAUSE_TAIL_STEPS = 2


@dataclass(frozen=True)
class Commit:
    t: float  # wall time of the commit (time.time())
    step: int  # committed steps after it
    born: float = 0.0  # start of the process (or group start) that committed it
    # New data trained, in rows-per-rank units (ROWS): 1 for a torchft group's step; a
    # Phalanx group's share of the global batch (2 alone, 0 while it heals).
    work: float = 1.0


@dataclass(frozen=True)
class Kill:
    t: float
    group: int  # the timeline group it hits (the DDP world is group 0)
    pids: tuple[int, ...]
    label: str = ""  # what was killed: "rank 1", "group 0", "node-b"


@dataclass
class KillMeasure:
    t: float
    group: int
    label: str
    recovery_s: float | None  # SIGKILL -> the killed group's first commit from a new process
    redone: int | None  # last step committed before the kill - (first step after it - 1), >= 0
    pause_s: float | None  # survivors' longest gap (DDP: the world's pause)
    last_before: int | None
    first_after: int | None
    milestones: dict[str, float] = field(default_factory=dict)  # label -> seconds after the kill


def iso_time(value: str) -> float:
    """An ISO 8601 timestamp (Phalanx events: UTC with a Z) as seconds since the epoch."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def step_at(commits: Sequence[Commit], t: float) -> int:
    """The step of the last commit at or before t (0 before any): the group's position."""
    before = [c for c in commits if c.t <= t]
    return before[-1].step if before else 0


def count_between(commits: Iterable[Commit], a: float, b: float) -> int:
    return sum(1 for c in commits if a < c.t <= b)


def rate(commits: Sequence[Commit], a: float, b: float) -> float:
    """Committed steps per second in (a, b]."""
    return count_between(commits, a, b) / (b - a) if b > a else 0.0


def net_rate(commits: Sequence[Commit], a: float, b: float) -> float:
    """Net progress of the position per second over (a, b] (steps redone do not count)."""
    return (step_at(commits, b) - step_at(commits, a)) / (b - a) if b > a else 0.0


def pooled_rate(
    commits: Sequence[Commit], windows: Sequence[tuple[float, float]], net: bool = False
) -> float:
    """Steps per second over several windows (a, b] taken together, as if one window of
    their summed length: :func:`net_rate` with `net`, else :func:`rate`."""
    per_window = net_rate if net else rate
    spans = [(a, b) for a, b in windows if b > a]
    seconds = sum(b - a for a, b in spans)
    if seconds <= 0:
        return 0.0
    return sum(per_window(commits, a, b) * (b - a) for a, b in spans) / seconds


def longest_gap(times: Sequence[float]) -> float:
    return max((y - x for x, y in itertools.pairwise(times)), default=0.0)


def survivor_pause(commits: Sequence[Commit], kill_t: float, until: float, horizon: float) -> float:
    """Longest gap between consecutive commits of a group that was not killed, from its
    last commit at or before the kill through PAUSE_TAIL_STEPS commits after `until` (the
    killed group's recovery); a gap still open at `horizon` counts up to the horizon."""
    before = [c.t for c in commits if c.t <= kill_t]
    after = [c.t for c in commits if c.t > kill_t]
    tail = [t for t in after if t > until][:PAUSE_TAIL_STEPS]
    times = [*before[-1:], *[t for t in after if t <= until], *tail]
    if len(tail) < PAUSE_TAIL_STEPS:  # the group had not caught up by the horizon
        times.append(horizon)
    return longest_gap(times)


def first_milestones(
    events: Sequence[tuple[float, str]], kill_t: float, until: float | None
) -> dict[str, float]:
    """For each label, seconds from the kill to its first event after the kill (and
    before `until`, the recovery, when given)."""
    out: dict[str, float] = {}
    for t, label in sorted(events):
        if t > kill_t and (until is None or t <= until) and label not in out:
            out[label] = round(t - kill_t, 3)
    return out


def measure_kill(
    timelines: dict[int, list[Commit]],
    kill: Kill,
    horizon: float,
    milestones: dict[int, list[tuple[float, str]]] | None = None,
) -> KillMeasure:
    """Recovery, steps redone and the survivors' longest pause of one kill.

    The killed group has recovered at its first commit after the kill by a process born
    after it: a DDP rank that survived the kill may still commit a step it had started,
    but torchrun restarts it all the same.
    """
    own = timelines.get(kill.group, [])
    fresh = [c for c in own if c.t > kill.t and c.born > kill.t]
    first = fresh[0] if fresh else None
    end = first.t if first else horizon
    old = [c for c in own if c.born <= kill.t and c.t <= end]
    last_before = old[-1].step if old else None
    recovery = round(first.t - kill.t, 3) if first else None
    redone = None
    if first is not None:
        redone = max(0, (last_before or 0) - (first.step - 1))
    others = [g for g in timelines if g != kill.group]
    if others:
        pauses = [survivor_pause(timelines[g], kill.t, end, horizon) for g in others]
        pause: float | None = round(max(pauses), 3)
    else:  # the world restarts: its pause is from its last commit to its first one after
        before = [c.t for c in own if c.t <= kill.t]
        pause = round(first.t - before[-1], 3) if first and before else None
    marks = first_milestones(
        (milestones or {}).get(kill.group, []), kill.t, first.t if first else None
    )
    return KillMeasure(
        kill.t,
        kill.group,
        kill.label,
        recovery,
        redone,
        pause,
        last_before,
        first.step if first else None,
        marks,
    )


def settled(timelines: dict[int, list[Commit]], kills: Sequence[Kill]) -> bool:
    """Every killed group committed again from a new process, and every other group
    committed PAUSE_TAIL_STEPS steps after that: each kill can be measured."""
    for kill in kills:
        fresh = [c.t for c in timelines.get(kill.group, []) if c.t > kill.t and c.born > kill.t]
        if not fresh:
            return False
        for g, commits in timelines.items():
            if g != kill.group and sum(1 for c in commits if c.t > fresh[0]) < PAUSE_TAIL_STEPS:
                return False
    return True


def milestone_medians(runs: Sequence[RunResult]) -> dict[str, float]:
    """Median seconds from the kill to each milestone, over every kill that reached it,
    ordered by that median."""
    seen: dict[str, list[float]] = {}
    for r in runs:
        for k in r.kills:
            for label, seconds in k.milestones.items():
                seen.setdefault(label, []).append(seconds)
    medians = {label: round(statistics.median(v), 3) for label, v in seen.items()}
    return dict(sorted(medians.items(), key=lambda item: item[1]))


def goodput(
    timelines: dict[int, list[Commit]], rates: dict[int, float], a: float, b: float
) -> float:
    """Useful steps over (a, b] / (failure-free rate x (b - a)).

    One group (the DDP world): the net progress of its position, so steps redone after
    a restart do not count. Several groups: the new data of every commit of every group
    counts (Commit.work: a torchft group's step, or a Phalanx group's share of the global
    batch, which is the whole batch while it trains alone), against the sum of the
    groups' failure-free rates.
    """
    expected = sum(rates.values()) * (b - a)
    if expected <= 0:
        return 0.0
    return useful(timelines, a, b) / expected


def useful(timelines: dict[int, list[Commit]], a: float, b: float) -> float:
    """Useful work over (a, b], counted as :func:`goodput` counts it (in steps)."""
    if len(timelines) == 1:
        (commits,) = timelines.values()
        return float(step_at(commits, b) - step_at(commits, a))
    return sum(c.work for cs in timelines.values() for c in cs if a < c.t <= b)


def after_kills(
    timelines: dict[int, list[Commit]],
    rates: dict[int, float],
    kills: Sequence[Kill],
    span: float,
    bin_s: float = 2.0,
) -> list[float]:
    """Where goodput goes: for each `bin_s` bin of the `span` seconds after a kill, the
    useful work in it over the failure-free rate's, averaged over the kills (1.0: as
    fast as without failures). Kills whose span runs past the last commit are left out."""
    expected = sum(rates.values()) * bin_s
    end = max((c.t for cs in timelines.values() for c in cs), default=0.0)
    measured = [k for k in kills if k.t + span <= end]
    if expected <= 0 or not measured:
        return []
    bins = int(span // bin_s)
    return [
        round(
            statistics.fmean(
                useful(timelines, k.t + i * bin_s, k.t + (i + 1) * bin_s) for k in measured
            )
            / expected,
            3,
        )
        for i in range(bins)
    ]


@dataclass
class Spread:
    n: int
    min: float | None
    median: float | None
    max: float | None


def spread(values: Iterable[float | None]) -> Spread:
    vs = [v for v in values if v is not None]
    if not vs:
        return Spread(0, None, None, None)
    return Spread(len(vs), min(vs), statistics.median(vs), max(vs))


def median_or_none(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


@dataclass
class RunResult:
    """One repeat of one system."""

    system: str
    rates: dict[int, float]  # failure-free steps/s per group (DDP: the world, group 0)
    goodput: float | None
    kills: list[KillMeasure]
    phases: dict[str, float]  # wall times of the phase boundaries
    notes: list[str] = field(default_factory=list)
    after_kills: list[float] = field(default_factory=list)  # see after_kills()
    drift: float | None = None  # failure-free rate after the chaos / before it
    cpu: dict[str, float] = field(default_factory=dict)  # bench.peer_cpu.shares, failure-free

    @property
    def steps_per_s(self) -> float:
        """The world's steps/s (DDP) or the mean of the groups' steps/s."""
        return statistics.fmean(self.rates.values()) if self.rates else 0.0

    def per_kill_median(self, name: str) -> float | None:
        return median_or_none(getattr(k, name) for k in self.kills)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps_per_s"] = self.steps_per_s
        return out


MEASURES: tuple[tuple[str, str], ...] = (
    ("steps_per_s", "failure-free steps/s"),
    ("recovery_s", "recovery s"),
    ("redone", "steps redone"),
    ("pause_s", "survivors' longest pause s"),
    ("goodput", "goodput"),
)


def over_repeats(runs: Sequence[RunResult], name: str) -> Spread:
    """min/median/max over repeats; a per-kill measure enters as each repeat's median."""
    if name == "steps_per_s":
        return spread(r.steps_per_s for r in runs)
    if name == "goodput":
        return spread(r.goodput for r in runs)
    return spread(r.per_kill_median(name) for r in runs)


def over_kills(runs: Sequence[RunResult], name: str) -> Spread:
    """min/median/max over every kill of every repeat."""
    return spread(getattr(k, name) for r in runs for k in r.kills)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
