"""A failed step attempt's own gradients, kept for the retry (see ``Loop._reuse``); the
step's report is :class:`trainer.step_report.StepReport`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.data.shares import Quorum


@dataclass(frozen=True)
class Attempt:
    """A failed attempt's own gradients (left in ``p.grad``): step, quorum, share, and the
    sum of this rank's per-item losses over the share (a device scalar)."""

    step: int
    quorum: Quorum
    share: range
    losses: torch.Tensor
