"""Pipeline parallelism with ``torch.distributed.pipelining``.

The workload's model is cut into ``pp * stages_per_rank`` stages along its trunk (an
``nn.ModuleDict``): stage ``k`` holds the trunk entries from split point ``k - 1``
up to split point ``k``; the root's other parts go to the first stage if they come
before the trunk and to the last if they come after it (see trainer/workloads/api.py).
Rank ``r`` of the pp axis holds stages ``r, r + pp, ...`` (the "loop" placement that
Interleaved1F1B expects; with one stage per rank it is simply stage ``r``). Each
stage keeps the full model's parameter names, so checkpoints and digests are
comparable across layouts.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from trainer.config import TrainerConfig
from trainer.parallel.mesh import Layout
from trainer.workloads import LossFn, Workload, WorkloadError

Schedule = PipelineScheduleSingle | PipelineScheduleMulti


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    return [pp_rank + i * pp for i in range(stages_per_rank)]


def trunk_runs(
    trunk: nn.ModuleDict, split_points: Sequence[str], prefix: str, n_stages: int, where: str
) -> list[list[str]]:
    """The trunk's keys, cut at the split points (or into equal runs when none are given)."""
    keys = list(trunk.keys())
    if not split_points:
        base, extra = divmod(len(keys), n_stages)
        sizes = [base + (1 if s < extra else 0) for s in range(n_stages)]
    else:
        if len(split_points) != n_stages - 1:
            raise WorkloadError(
                f"{where}: {len(split_points)} split points make {len(split_points) + 1} stages, "
                f"but parallel.pp * pp_stages_per_rank is {n_stages}; give {n_stages - 1}."
            )
        starts = []
        for point in split_points:
            key = point.removeprefix(f"{prefix}.")
            if key == point or key not in trunk:
                raise WorkloadError(
                    f"{where}: split point {point!r} is not an entry of the trunk {prefix!r}; "
                    f"name one of {prefix}.<key>."
                )
            starts.append(keys.index(key))
        bounds = [0, *starts, len(keys)]
        sizes = [bounds[i + 1] - bounds[i] for i in range(n_stages)]
    if any(size < 1 for size in sizes):
        raise WorkloadError(
            f"{where}: the trunk {prefix!r} has {len(keys)} entries, which cannot make {n_stages} "
            "non-empty pipeline stages at these split points; fewer stages or other split points."
        )
    runs, start = [], 0
    for size in sizes:
        runs.append(keys[start : start + size])
        start += size
    return runs


def cut_stage(
    model: nn.Module, trunk_path: str, keep: list[str], first: bool, last: bool
) -> nn.Module:
    """A copy of the (meta) model holding only trunk entries `keep`, plus the parts before
    the trunk if `first` and after it if `last` (the others become None)."""
    stage = copy.deepcopy(model)
    parent: nn.Module = stage
    parts = trunk_path.split(".")
    for depth, part in enumerate(parts):
        names = list(parent._modules)
        at = names.index(part)
        for i, name in enumerate(names):
            if (i < at and not first) or (i > at and not last):
                setattr(parent, name, None)
        child = parent._modules[part]
        assert child is not None
        if depth == len(parts) - 1:
            assert isinstance(child, nn.ModuleDict)
            for key in list(child.keys()):
                if key not in keep:
                    del child[key]
        parent = child
    return stage


def build_stage_models(
    model: nn.Module, workload: Workload, cfg: TrainerConfig, layout: Layout, where: str
) -> list[tuple[int, nn.Module]]:
    """(stage index, module) for every stage this rank holds."""
    p = cfg.parallel
    n_stages = p.pp * p.stages_per_rank
    trunk = model.get_submodule(workload.trunk) if workload.trunk else None
    if not isinstance(trunk, nn.ModuleDict):
        raise WorkloadError(
            f"{where}: parallel.pp > 1 needs workload.trunk to name an nn.ModuleDict of the "
            f"model (got {workload.trunk!r}); key its blocks by index so names stay stable."
        )
    assert workload.trunk is not None
    runs = trunk_runs(trunk, workload.split_points, workload.trunk, n_stages, where)
    return [
        (s, cut_stage(model, workload.trunk, runs[s], first=s == 0, last=s == n_stages - 1))
        for s in stage_ids(layout.pp_rank, p.pp, p.stages_per_rank)
    ]


def build_schedule(
    stages: list[tuple[int, nn.Module]], cfg: TrainerConfig, layout: Layout, loss_fn: LossFn
) -> tuple[Schedule, list[_PipelineStageBase]]:
    p = cfg.parallel
    n_stages = p.pp * p.stages_per_rank
    group = layout.group("pp")
    pipeline_stages: list[_PipelineStageBase] = [
        PipelineStage(module, index, n_stages, layout.device, group=group)
        for index, module in stages
    ]
    schedule: Schedule
    # scale_grads=False: a step may run the schedule several times (its share of the
    # global batch), and torch's scaling would divide the earlier runs' gradients again;
    # the loop's weight (WeightedLoss) carries the 1/microbatches instead.
    if p.pp_schedule == "Interleaved1F1B":
        schedule = ScheduleInterleaved1F1B(
            pipeline_stages, p.microbatches, loss_fn=loss_fn, scale_grads=False
        )
    elif p.pp_schedule == "GPipe":
        schedule = ScheduleGPipe(
            pipeline_stages[0], p.microbatches, loss_fn=loss_fn, scale_grads=False
        )
    else:
        schedule = Schedule1F1B(
            pipeline_stages[0], p.microbatches, loss_fn=loss_fn, scale_grads=False
        )
    return schedule, pipeline_stages


class WeightedLoss:
    """The schedule's loss function: the workload's loss times `weight` (what this
    microbatch's items count for in the step), keeping the unweighted values."""

    def __init__(self, fn: LossFn) -> None:
        self.fn = fn
        self.weight = 1.0
        self.raw: list[torch.Tensor] = []

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.fn(output, target)
        self.raw.append(loss.detach())
        return loss * self.weight if self.weight != 1.0 else loss
