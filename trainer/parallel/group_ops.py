"""Small collectives inside one replica group, shared by the training loop and evaluation."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from trainer.data.sources import StepData
from trainer.parallel.mesh import Layout


def group_sum(
    layout: Layout, last: bool, mine: float, flags: list[bool] | None = None
) -> tuple[float, list[bool]]:
    """One all-reduce inside the group: the sum of `mine` over the ranks on the last
    pipeline stage with tp_rank 0 (each data shard's once: its cp ranks, which hold equal
    slices of the same items, add their mean), and each flag, true if it is true on any
    rank."""
    flags = flags or []
    if layout.mesh is None:
        return mine, flags
    contributes = last and layout.tp_rank == 0
    part = mine / layout.cp if contributes else 0.0
    t = torch.tensor([part, *map(float, flags)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]), [bool(v > 0) for v in t[1:].tolist()]


def on_any_rank(flags: list[bool]) -> list[bool]:
    """Each flag, true if it is true on any rank of the group (its default process group;
    as given where there is none). The one spelling of "any rank" and, through
    :func:`on_every_rank`, of "every rank"."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(flags)
    t = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v > 0) for v in t.tolist()]


def on_every_rank(flags: list[bool]) -> list[bool]:
    """Each flag, true if it is true on every rank of the group."""
    return [not f for f in on_any_rank([not f for f in flags])]


def group_any(layout: Layout, flags: list[bool]) -> list[bool]:
    """Each flag, true if it is true on any rank of the group."""
    return list(flags) if layout.mesh is None else on_any_rank(flags)


def run_schedule(call: Callable[..., object], batch: StepData, first: bool, last: bool) -> float:
    """One pipeline schedule call (a training step or an evaluation) over a batch: the
    mean microbatch loss on the last stage, 0.0 on the others."""
    losses: list[torch.Tensor] = []
    args = (batch.inputs,) if first else ()
    if last:
        call(*args, target=batch.targets, losses=losses)
    else:
        call(*args)
    return float(torch.stack(losses).mean()) if losses else 0.0
