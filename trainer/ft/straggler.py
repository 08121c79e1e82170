"""Stragglers: a rank whose compute is persistently slower than the same rank of the
other replica groups.

Every group waits for the slowest at the cross-group gradient exchange, so one slow
group (a throttled GPU, a bad NIC, a noisy neighbour) slows them all. Each rank
measures its step's compute (forward and backward, without the time it waited for a
quorum or for the other groups) and sends it with the step's loss, in the exchange
the step makes anyway: the average over the participating groups comes back with no
collective of its own. From that average and its own time a rank knows the others'
mean, and a rank whose ratio to it stays at or above ``ft.straggler_factor`` over
``ft.straggler_steps`` steps (their median) names itself in a ``straggler`` event and
a metric; ``straggler_cleared`` when the median falls below again.

On CUDA the compute is timed with events read a step later (once the loss's read
has synchronised the stream), so measuring adds no host sync.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from trainer import logs
from trainer.config import FaultToleranceConfig
from trainer.contracts import rank_events as events


class ComputeClock:
    """This rank's compute time per step: wall time on the CPU; on CUDA, the previous
    step's events, once they completed (None until then)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._t0 = 0.0
        self._start: Any = None
        self._pending: tuple[Any, Any] | None = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self, waited_s: float) -> float | None:
        """The compute since start(), less `waited_s` spent waiting on other groups."""
        if not self.cuda:
            return max(0.0, time.perf_counter() - self._t0 - waited_s)
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record()
        done, self._pending = self._pending, (self._start, end)
        if done is None or not done[1].query():
            return None
        return float(done[0].elapsed_time(done[1])) / 1000.0


@dataclass(frozen=True)
class Verdict:
    """A change of this rank's straggler state, and the figures behind it."""

    straggler: bool
    own_s: float  # this rank's median compute over the window
    others_s: float  # the median of the other groups' mean compute
    ratio: float


class StragglerWatch:
    def __init__(self, cfg: FaultToleranceConfig, rank: int) -> None:
        self.factor = cfg.straggler_factor
        self.rank = rank
        self.own: deque[float] = deque(maxlen=cfg.straggler_steps)
        self.others: deque[float] = deque(maxlen=cfg.straggler_steps)
        self.flagged = False
        self.last_ratio: float | None = None

    def check(self, step: int, own_s: float, mean_s: float, groups: int) -> None:
        """Observe one step; log ``straggler`` / ``straggler_cleared`` when the state changes."""
        verdict = self.observe(own_s, mean_s, groups)
        if verdict is not None:
            logs.get().warning(
                events.STRAGGLER if verdict.straggler else events.STRAGGLER_CLEARED,
                step=step,
                rank=self.rank,
                compute_s=round(verdict.own_s, 4),
                others_s=round(verdict.others_s, 4),
                ratio=round(verdict.ratio, 2),
                factor=self.factor,
            )

    def observe(self, own_s: float, mean_s: float, groups: int) -> Verdict | None:
        """One step's compute: this rank's, and the mean over the `groups` participating
        groups. Returns a Verdict when the straggler state changes."""
        if self.factor <= 0 or groups < 2:
            return None
        others = (mean_s * groups - own_s) / (groups - 1)
        if others <= 0:
            return None
        self.own.append(own_s)
        self.others.append(others)
        if len(self.own) < (self.own.maxlen or 1):
            return None
        own_m, others_m = statistics.median(self.own), statistics.median(self.others)
        self.last_ratio = ratio = own_m / others_m
        slow = ratio >= self.factor
        if slow == self.flagged:
            return None
        self.flagged = slow
        return Verdict(slow, own_m, others_m, ratio)
