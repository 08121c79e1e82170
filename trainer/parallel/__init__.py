"""Parallelism inside one replica group, applied in a fixed order: the device mesh
(pp, dp_shard, cp, tp), tensor parallel then FSDP2 with mixed precision, context parallel
(a slice of each sequence per cp rank), the pipeline
stages and schedules, materializing the meta model into initialised shards, the
group's small collectives and the full-parameter digest.
"""

from __future__ import annotations

from trainer.parallel.digest import params_sha256
from trainer.parallel.group_ops import group_sum, run_schedule
from trainer.parallel.materialize import build_materialized
from trainer.parallel.mesh import Layout, init_distributed
from trainer.parallel.parallelize import autocast, autocast_dtype
from trainer.parallel.pipeline import (
    Schedule,
    WeightedLoss,
    build_schedule,
    build_stage_models,
    stage_ids,
)

__all__ = [
    "Layout",
    "Schedule",
    "WeightedLoss",
    "autocast",
    "autocast_dtype",
    "build_materialized",
    "build_schedule",
    "build_stage_models",
    "group_sum",
    "init_distributed",
    "params_sha256",
    "run_schedule",
    "stage_ids",
]
