"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut into ``pp * stages_per_rank`` stages of consecutive blocks. Rank
``r`` of the pp axis holds stages ``r, r + pp, ...`` (the "loop" placement that
Interleaved1F1B expects; with one stage per rank it is simply stage ``r``). Each
stage is built from the full, deterministically initialised model with the other
parts dropped, so its weights equal the same blocks of a single-process run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
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
from trainer.mesh import Layout
from trainer.model import Transformer, build_model

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Schedule = PipelineScheduleSingle | PipelineScheduleMulti


def split_layers(n_layers: int, n_stages: int) -> list[list[int]]:
    """Consecutive, near-equal runs of block ids; earlier stages take the remainder."""
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for stage in range(n_stages):
        size = base + (1 if stage < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    return [pp_rank + i * pp for i in range(stages_per_rank)]


def build_stage_models(cfg: TrainerConfig, layout: Layout) -> list[tuple[int, Transformer]]:
    """(stage index, module) for every stage this rank holds."""
    p = cfg.parallel
    n_stages = p.pp * p.stages_per_rank
    layers = split_layers(cfg.model.n_layers, n_stages)
    out = []
    for stage in stage_ids(layout.pp_rank, p.pp, p.stages_per_rank):
        model = build_model(cfg.model, cfg.train.seed)
        model.keep_stage(layers[stage], first=stage == 0, last=stage == n_stages - 1)
        out.append((stage, model))
    return out


def build_schedule(
    stages: list[tuple[int, Transformer]], cfg: TrainerConfig, layout: Layout, loss_fn: LossFn
) -> tuple[Schedule, list[_PipelineStageBase]]:
    p = cfg.parallel
    n_stages = p.pp * p.stages_per_rank
    group = layout.group("pp")
    pipeline_stages: list[_PipelineStageBase] = [
        PipelineStage(module, index, n_stages, layout.device, group=group)
        for index, module in stages
    ]
    schedule: Schedule
    if p.pp_schedule == "Interleaved1F1B":
        schedule = ScheduleInterleaved1F1B(pipeline_stages, p.microbatches, loss_fn=loss_fn)
    elif p.pp_schedule == "GPipe":
        schedule = ScheduleGPipe(pipeline_stages[0], p.microbatches, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(pipeline_stages[0], p.microbatches, loss_fn=loss_fn)
    return schedule, pipeline_stages
