"""Evaluation: every ``train.eval_every`` committed steps, the mean loss over a fixed set
of evaluation items.

The set is items ``0 .. eval_batches * batch_size - 1`` of the workload's
``eval_data``, read in ``eval_batches`` batches whose rows are split across the
group's ranks exactly as a training step's are. The replica groups hold bitwise
equal parameters after a commit, so every group computes the same value without
talking to the others; a healed group or a cold restart evaluates the same items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from trainer.data import Sampler
from trainer.mesh import Layout
from trainer.workload import LossFn

if TYPE_CHECKING:
    from trainer.loop import StepReport
    from trainer.pipeline import Schedule


@dataclass
class Evaluator:
    every: int
    batches: int
    sampler: Sampler  # over eval_data, one "group": batch b reads items b*batch_size + row
    models: list[nn.Module]
    layout: Layout
    loss_fn: LossFn
    rows: range  # this rank's rows of a batch
    autocast: torch.dtype | None
    schedule: Schedule | None = None
    first: bool = True
    last: bool = True
    on_eval: list[Callable[[int, float], None]] = field(default_factory=list)

    def after_step(self, report: StepReport) -> None:
        """An on_step callback of the loop: evaluate after every `every`-th committed step."""
        if report.committed and self.every and report.step % self.every == 0:
            loss = self.evaluate()
            for callback in self.on_eval:
                callback(report.step, loss)

    @torch.no_grad()
    def evaluate(self) -> float:
        for m in self.models:
            m.eval()
        try:
            total = sum(self._batch(b) for b in range(self.batches))
        finally:
            for m in self.models:
                m.train()
        return self._group_mean(total / self.batches)

    def _batch(self, index: int) -> float:
        batch = self.sampler.batch(index, self.rows, self.layout.device)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (batch.inputs,) if self.first else ()
            if self.last:
                self.schedule.eval(*args, target=batch.targets, losses=losses)
            else:
                self.schedule.eval(*args)
            return float(torch.stack(losses).mean()) if losses else 0.0
        with torch.autocast(
            self.layout.device.type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            output = self.models[0](batch.inputs)
        return float(self.loss_fn(output, batch.targets))

    def _group_mean(self, mine: float) -> float:
        """The mean over the ranks that hold a loss (last stage, tp rank 0)."""
        if self.layout.mesh is None:
            return mine
        contributes = self.last and self.layout.tp_rank == 0
        t = torch.tensor(
            [mine if contributes else 0.0, 1.0 if contributes else 0.0], dtype=torch.float64
        )
        dist.all_reduce(t)
        return float(t[0] / t[1])
