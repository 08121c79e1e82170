"""Context parallel: each of a data shard's cp ranks holds a slice of every sequence.

A sequence of ``seq_len`` positions is cut into ``2 * cp`` equal chunks; cp rank ``r``
holds chunks ``r`` and ``2*cp - 1 - r``. Under causal attention a position attends to
every earlier one, so the late chunks cost the most; pairing an early chunk with a
late one gives every rank the same work (torch's head-tail load balancer, and what
Llama 3's long-context training did).

For the forward and backward of a micro-batch (:func:`sequence_slice`), the rank's
inputs and targets (dimension 1) and the workload's per-position buffers (dimension 0,
``Workload.position_buffers``: rotary tables, position ids) are replaced by its
slices, and ``torch.nn.functional.scaled_dot_product_attention`` attends across the
cp ranks:

* ``all_gather`` (any device): K and V are all-gathered over the cp group and the
  local queries attend to the whole sequence under the causal mask of their own
  positions (trainer/parallel/cp_attention.py);
* ``torch`` (CUDA): torch's ``context_parallel`` (ring attention over its fused
  kernels), given the same buffers.

Everything else is per-position and needs nothing: the loss is each rank's mean over
its slice (equal slices, so their mean is the sequence's), and FSDP averages the
gradients over dp_shard x cp (mesh.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.config import ConfigError, ParallelConfig
from trainer.data.sources import StepData
from trainer.parallel.cp_attention import chunk_positions, gathered_sdpa
from trainer.parallel.mesh import Layout


@dataclass(frozen=True)
class ContextParallel:
    mesh: DeviceMesh  # the cp axis
    rank: int
    degree: int
    seq_len: int
    buffers: tuple[str, ...]  # the workload's per-position buffers (dimension 0)
    attention: str  # "all_gather" or "torch"

    def positions(self, device: torch.device) -> torch.Tensor:
        return chunk_positions(self.seq_len, self.degree, self.rank, device)


def context_parallel(
    cfg: ParallelConfig,
    layout: Layout,
    seq_len: int,
    models: Sequence[nn.Module],
    buffers: Sequence[str],
) -> ContextParallel | None:
    """The rank's context parallel, or None when parallel.cp is 1."""
    if layout.cp == 1:
        return None
    mesh = layout.sub("cp")
    assert mesh is not None
    attention = cfg.cp_attention
    if attention == "auto":
        attention = "torch" if layout.device.type == "cuda" else "all_gather"
    if attention == "torch" and layout.device.type != "cuda":
        raise ConfigError(
            f"parallel.cp_attention = 'torch' runs only on CUDA, but the ranks train on "
            f"{layout.device.type}; set parallel.cp_attention = 'all_gather'."
        )
    for name in buffers:
        owner, attr = _owner(models[0], name)
        table = None if owner is None else owner._buffers.get(attr)
        if table is None or table.dim() == 0 or table.shape[0] < seq_len:
            raise ConfigError(
                f"the workload's position_buffers name {name!r}, which is not a buffer of the "
                f"model with at least train.seq_len ({seq_len}) rows; name buffers whose "
                "first dimension is the position."
            )
    return ContextParallel(mesh, layout.cp_rank, layout.cp, seq_len, tuple(buffers), attention)


@contextlib.contextmanager
def sequence_slice(
    cp: ContextParallel | None, models: Sequence[nn.Module], batch: StepData
) -> Iterator[StepData]:
    """Around one micro-batch's forward and backward (a recomputed forward included):
    the rank's slice of the batch, its slices of the per-position buffers, and attention
    across the cp ranks. Without context parallel, the batch as it is."""
    if cp is None:
        yield batch
        return
    with contextlib.ExitStack() as stack:
        if cp.attention == "torch":  # torch shards the buffers in place and restores them
            from torch.distributed.tensor.experimental import context_parallel as torch_cp

            tables = [
                stack.enter_context(_swapped(m, name, slice(0, cp.seq_len)))
                for m in models
                for name in cp.buffers
            ]
            inputs, targets = batch.inputs.clone(), batch.targets.clone()
            stack.enter_context(
                torch_cp(
                    cp.mesh,
                    buffers=[inputs, targets, *tables],
                    buffer_seq_dims=[1, 1, *(0 for _ in tables)],
                    no_restore_buffers={inputs, targets},
                )
            )
            yield StepData(inputs, targets)
            return
        mine = cp.positions(batch.inputs.device)
        for m in models:
            for name in cp.buffers:
                stack.enter_context(_swapped(m, name, mine))
        stack.enter_context(_attention(cp))
        yield StepData(batch.inputs.index_select(1, mine), batch.targets.index_select(1, mine))


def _owner(model: nn.Module, name: str) -> tuple[nn.Module | None, str]:
    path, _, attr = name.rpartition(".")
    try:
        return (model.get_submodule(path) if path else model), attr
    except AttributeError:
        return None, attr


@contextlib.contextmanager
def _swapped(model: nn.Module, name: str, rows: slice | torch.Tensor) -> Iterator[torch.Tensor]:
    """The buffer `name` replaced by its `rows` (a copy), put back after."""
    owner, attr = _owner(model, name)
    assert owner is not None
    kept = owner._buffers[attr]
    assert kept is not None
    table = (
        kept[rows].clone()
        if isinstance(rows, slice)
        else kept.index_select(0, rows.to(kept.device))
    )
    owner._buffers[attr] = table
    try:
        yield table
    finally:
        owner._buffers[attr] = kept


@contextlib.contextmanager
def _attention(cp: ContextParallel) -> Iterator[None]:
    original = F.scaled_dot_product_attention
    sdpa = gathered_sdpa(cp.mesh.get_group(), cp.seq_len, original)
    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
