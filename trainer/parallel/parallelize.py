"""Parallelism inside a replica group, applied to the workload's (meta) model by explicit
functions in a fixed order: float8 (fp8.py), tensor parallel, activation checkpointing,
compile, FSDP2.
Pipeline splitting happens before (pipeline.py cuts the stage modules these functions
then parallelize); materialize.py allocates and initialises the shards after.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

from trainer import logs
from trainer.config import ParallelConfig
from trainer.parallel.fp8 import FP8_COMPILES, apply_fp8
from trainer.parallel.fp8 import check_device as check_fp8_device
from trainer.parallel.mesh import Layout
from trainer.workloads import Workload, matching, units

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "sequence_parallel": SequenceParallel,
}


def apply_tp(model: nn.Module, workload: Workload, tp_mesh: DeviceMesh) -> None:
    """The workload's plan: a callable applies itself; a mapping gives each matching module
    its style (paths absent from this pipeline stage are skipped)."""
    plan = workload.tp_plan
    if plan is None:
        return
    if not isinstance(plan, Mapping):
        plan(model, tp_mesh)
        return
    for pattern, style in plan.items():
        chosen = STYLES[style]() if isinstance(style, str) else style
        for _, module in matching(model, pattern):
            parallelize_module(module, tp_mesh, chosen, src_data_rank=None)


def apply_ac(model: nn.Module, workload: Workload) -> None:
    """Recompute each shard unit's activations in backward (its parameter names unchanged)."""
    for unit in units(model, workload.shard_units):
        unit.forward = functools.partial(_recomputed, unit.forward)


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_compile(model: nn.Module, workload: Workload) -> None:
    for unit in units(model, workload.shard_units):
        unit.compile()


def apply_fsdp(
    model: nn.Module, workload: Workload, dp_mesh: DeviceMesh, cfg: ParallelConfig
) -> None:
    """fully_shard each shard unit, then the root (whatever the units leave)."""
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )
    # With pipelining, each microbatch would all-gather again; keep params gathered.
    reshard = cfg.pp == 1
    for unit in units(model, workload.shard_units):
        fully_shard(unit, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)


def compiles(cfg: ParallelConfig) -> bool:
    """Whether the blocks are compiled: parallel.compile, or parallel.fp8 (FP8_COMPILES)."""
    return cfg.compile or cfg.fp8


def parallelize(
    model: nn.Module, workload: Workload, cfg: ParallelConfig, layout: Layout
) -> nn.Module:
    if cfg.fp8:
        check_fp8_device(layout.device)
        if not cfg.compile:
            logs.get().warning("fp8_compiles", reason=FP8_COMPILES)
        apply_fp8(model, cfg, sharded=layout.fsdp is not None)
    tp_mesh = layout.sub("tp")
    if tp_mesh is not None:
        apply_tp(model, workload, tp_mesh)
    if cfg.activation_checkpointing == "full":
        apply_ac(model, workload)
    if compiles(cfg):
        apply_compile(model, workload)
    if layout.fsdp is not None:  # dp_shard x cp (mesh.py)
        apply_fsdp(model, workload, layout.fsdp, cfg)
    return model


def autocast_dtype(cfg: ParallelConfig, layout: Layout) -> torch.dtype | None:
    """Without FSDP, bf16 params mean autocast; FSDP's MixedPrecisionPolicy handles it otherwise."""
    if cfg.param_dtype == "float32" or layout.fsdp is not None:
        return None
    return DTYPES[cfg.param_dtype]


def autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """The forward's autocast context: `dtype` from autocast_dtype, or off when None."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
