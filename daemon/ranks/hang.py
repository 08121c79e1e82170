"""Hang timeouts per phase: what each rank's heartbeat says, and how long each phase may
stay silent before the rank counts as hung.

A rank writes the phase it enters into its heartbeat file (``trainer/contracts/heartbeat.py``):
``start`` (the daemon's empty file at spawn, then the build), ``load``, ``step``
(after each step, with the seconds it spent in the step), ``quorum`` (waiting for a
quorum that has not formed), ``heal``, ``save``, ``eval`` and ``finish``. Each write
is progress. Steady steps get a timeout learned from the step times seen: a high
quantile times a factor, within a floor and a ceiling. The floor is never below
``ft.timeout_s`` plus a margin, because a healthy rank waits that long for a dead
peer's collective; a quorum wait is bounded by torchft's quorum timeout. The other
phases take their settings from ``[hang]`` (docs/failure-modes.md, "Hang timeouts").

Everything here is a value: :class:`StepTimes` returns a new one with each sample,
so a group's restart keeps what its predecessors learned (``NodeGroup`` holds it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from daemon.config import DaemonConfig

WINDOW = 512  # the step times the learned timeout is drawn from (the newest)


@dataclass(frozen=True)
class HangLimits:
    """The settings, resolved: seconds per configured phase, and how steps learn."""

    fixed: dict[str, float]
    quantile: float
    factor: float
    samples: int
    floor_s: float
    ceiling_s: float

    @classmethod
    def from_config(cls, cfg: DaemonConfig) -> HangLimits:
        h, default = cfg.hang, cfg.node.hang_timeout_s
        margin = h.margin_s
        ceiling = default
        floor = min(max(h.step_min_s, cfg.ft.timeout_s + margin), ceiling)
        # A quorum wait ends by torchft's own timeout (the rank exits 75, its node waits for
        # its peers): the hang check must not get there first.
        quorum = max(default, cfg.ft.quorum_timeout_s + cfg.ft.timeout_s + margin)
        fixed = {
            "start": h.start_s or default,
            "load": h.load_s or default,
            "save": h.save_s or default,
            "eval": h.eval_s or default,
            "heal": max(h.heal_s or default, cfg.ft.timeout_s + margin),
            "quorum": quorum,
            "finish": default,
        }
        return cls(fixed, h.step_quantile, h.step_factor, h.step_samples, floor, ceiling)


@dataclass(frozen=True)
class StepTimes:
    """The newest step times seen on this node (seconds), across the group's restarts."""

    seen: tuple[float, ...] = ()
    count: int = 0  # every sample ever added (the window keeps the newest WINDOW)

    def add(self, samples: list[float]) -> StepTimes:
        if not samples:
            return self
        kept = (*self.seen, *samples)[-WINDOW:]
        return replace(self, seen=kept, count=self.count + len(samples))

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (nearest rank) of the kept samples; None with none."""
        if not self.seen:
            return None
        ordered = sorted(self.seen)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Timeouts:
    """Seconds per phase as they apply now; `learned`: the step's came from step times."""

    by_phase: dict[str, float] = field(default_factory=dict)
    learned: bool = False
    step_quantile_s: float | None = None  # the quantile the step timeout came from
    step_median_s: float | None = None  # the median step time, for comparison

    def of(self, phase: str) -> float:
        return self.by_phase[phase]


def timeouts(limits: HangLimits, times: StepTimes) -> Timeouts:
    """Every phase's timeout: the step's learned once `limits.samples` steps were seen."""
    q = times.quantile(limits.quantile)
    learned = q is not None and times.count >= limits.samples
    if learned and q is not None:
        step = min(limits.ceiling_s, max(limits.floor_s, q * limits.factor))
    else:
        step = limits.ceiling_s
    return Timeouts({**limits.fixed, "step": step}, learned, q, times.quantile(0.5))
