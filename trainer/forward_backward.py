"""This rank's forward and backward over the micro-batches of one step's plan.

Each micro-batch's loss is weighted so that the update is the mean over the step's
items (trainer/data/shares.py); a rank with nothing left to train on still runs a
zero-weight pass, so its group's collectives match. Gradient accumulation runs the
model once per micro-batch (FSDP syncs on the last); a pipelined rank runs its
schedule once per micro-batch. Each returns the sum of this rank's per-item losses as
one device scalar, read once per step by the loop (a read per micro-step would stall a
GPU each time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainer.data.shares import RankPlan
from trainer.data.sources import Sampler
from trainer.parallel.context import ContextParallel, sequence_slice
from trainer.parallel.group_ops import run_schedule
from trainer.parallel.parallelize import autocast
from trainer.workloads import LossFn

if TYPE_CHECKING:  # torch.distributed.pipelining is imported only by pipelined runs
    from trainer.parallel.pipeline import Schedule, WeightedLoss


@dataclass(frozen=True)
class ForwardBackward:
    models: list[nn.Module]  # the model, or this rank's pipeline stages
    sampler: Sampler
    loss_fn: LossFn
    device: torch.device
    sharded: bool  # FSDP: gradients sync on the last micro-batch only
    autocast: torch.dtype | None
    cp: ContextParallel | None
    global_batch: int  # items per step
    unit: int  # items per forward (whole schedule batches where pipelined)
    schedule: Schedule | None = None
    pipeline_loss: WeightedLoss | None = None  # the schedule's loss function
    microbatches: int = 1  # the schedule's (parallel.microbatches)
    first: bool = True  # this rank holds the first pipeline stage (feeds the inputs)
    last: bool = True  # ... the last stage (computes the loss)

    def run(self, step: int, plan: RankPlan) -> torch.Tensor:
        """The plan's passes, pipelined or accumulated; the sum of per-item losses."""
        if self.schedule is not None:
            return self.pipeline(step, plan)
        return self.accumulate(step, plan)

    def filler(self, step: int) -> range:
        """Items for a zero-weight pass (a rank with nothing left to train on in a step
        still runs its group's collectives)."""
        first = step * self.global_batch
        return range(first, first + self.unit)

    def accumulate(self, step: int, plan: RankPlan) -> torch.Tensor:
        """Forward and backward of each micro-batch; the sum of per-item losses."""
        model = self.models[0]
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        last = len(plan.micro_batches) - 1
        for i, (items, weight) in enumerate(zip(plan.micro_batches, plan.weights, strict=True)):
            whole = self.sampler.take(items or self.filler(step), self.device)
            if self.sharded:
                model.set_requires_gradient_sync(i == last)  # type: ignore[operator]
            # A zero-weight pass runs in eval mode: it must not change the buffers (BatchNorm
            # statistics of filler items), and BatchNorm refuses one item in training mode.
            if not items:
                model.eval()
            with sequence_slice(self.cp, self.models, whole) as batch:
                with autocast(self.device, self.autocast):
                    output = model(batch.inputs)
                if not items:
                    model.train()
                loss = self.loss_fn(output, batch.targets)
                (loss * weight).backward()  # type: ignore[no-untyped-call]
            if items:
                total += loss.detach().double() * len(items)
        return total

    def pipeline(self, step: int, plan: RankPlan) -> torch.Tensor:
        """One schedule run per micro-batch (whole schedule batches); the sum of per-item
        losses (0.0 off the last stage)."""
        assert self.schedule is not None and self.pipeline_loss is not None
        weighted = self.pipeline_loss
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        try:
            for items, weight in zip(plan.micro_batches, plan.weights, strict=True):
                batch = self.sampler.take(items or self.filler(step), self.device)
                weighted.weight = weight / self.microbatches
                weighted.raw.clear()
                run_schedule(self.schedule.step, batch, self.first, self.last)
                # The last run's microbatches (a schedule's first run also computes a loss
                # while it infers shapes).
                raw = weighted.raw[-self.microbatches :]
                if items and raw:
                    total += torch.stack(raw).double().mean() * len(items)
        finally:
            weighted.weight = 1.0  # an evaluation runs the schedule unweighted
            weighted.raw.clear()
        return total
