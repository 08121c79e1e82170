"""What one step attempt leaves behind: the report of a step, and a failed attempt's own
gradients (see ``Loop._reuse``)."""

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


@dataclass
class StepReport:
    step: int  # committed steps after this one (1 for the first step)
    committed: bool
    loss: float | None  # None when the group healed after this step's forward (stale parameters)
    lr: float
    grad_norm: float
    participants: int
    quorum_id: int | None
    seconds: float
    tokens: int  # tokens this group trained on in the step
    items: range = range(0)  # the step's items this group trained on (empty unless committed)
    finite: bool = True  # False: a NaN/inf loss or gradient norm voted the step down
    diverged: bool = False  # the groups' parameters differed (this group is in the majority)
