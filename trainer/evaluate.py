"""Evaluation: every ``train.eval_every`` committed steps, the mean loss over a fixed set
of evaluation items.

The set is items ``0 .. eval_batches * batch_size - 1`` of the workload's
``eval_data``, read in ``eval_batches`` batches whose rows are split across the
group's ranks exactly as a training step's are. The replica groups hold bitwise
equal parameters after a commit, so every group computes the same value without
talking to the others; a healed group or a cold restart evaluates the same items.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.data.sources import Sampler
from trainer.forward_backward import ForwardBackward
from trainer.parallel.context import sequence_slice
from trainer.parallel.group_ops import group_sum, run_schedule
from trainer.parallel.mesh import Layout
from trainer.parallel.parallelize import autocast
from trainer.step_report import StepReport


@dataclass
class Evaluator:
    every: int
    batches: int
    sampler: Sampler  # over eval_data: batch b reads items b*batch_size + row
    batch_size: int
    passes: ForwardBackward  # the training loop's: its models, loss, schedule, autocast
    layout: Layout
    rows: range  # this rank's rows of a batch

    def due(self, report: StepReport) -> bool:
        """Whether to evaluate after this step: every `every`-th committed one."""
        return report.committed and bool(self.every) and report.step % self.every == 0

    @torch.no_grad()
    def evaluate(self) -> float:
        models = self.passes.models
        for m in models:
            m.eval()
        try:
            total = sum(self._batch(b) for b in range(self.batches))
        finally:
            for m in models:
                m.train()
        # One mean per data shard (each evaluates equal rows): their mean.
        mean = group_sum(self.layout, self.passes.last, total / self.batches)[0]
        return mean / self.layout.dp_shard

    def _batch(self, index: int) -> float:
        first = index * self.batch_size
        items = range(first + self.rows.start, first + self.rows.stop)
        batch = self.sampler.take(items, self.layout.device)
        p = self.passes
        if p.schedule is not None:
            return run_schedule(p.schedule.eval, batch, p.first, p.last)
        with sequence_slice(p.cp, p.models, batch) as mine:
            with autocast(self.layout.device, p.autocast):
                output = p.models[0](mine.inputs)
            return float(p.loss_fn(output, mine.targets))
