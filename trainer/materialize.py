"""From a parallelized meta model to real, initialised local shards.

Every parameter and buffer is filled from the workload's ``init(name, like, gen)``,
which returns the *full* tensor for that name; ``gen`` is seeded by ``train.seed``
and the name alone. A rank keeps only its shard of it (DTensor placements decide
which), so the initial parameters are bitwise the same for any layout: single
process, FSDP2, tensor or pipeline parallel. At most one full tensor exists at a
time, so the peak is the local shards plus the largest single parameter.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.workload import InitFn, Workload, WorkloadError


def stable_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one tensor: the same on every rank and in every layout."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def materialize(
    model: nn.Module, init: InitFn, seed: int, device: torch.device, where: str
) -> None:
    model.to_empty(device=device)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        gen = torch.Generator().manual_seed(stable_seed(seed, name))
        full = init(name, tensor, gen)
        if not isinstance(full, torch.Tensor) or tuple(full.shape) != tuple(tensor.shape):
            got = tuple(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
            raise WorkloadError(
                f"{where}: init returned {got} for {name!r}, whose shape is "
                f"{tuple(tensor.shape)}; return the full tensor for every parameter and buffer."
            )
        full = full.to(device=device, dtype=tensor.dtype)
        if isinstance(tensor, DTensor):
            shard = distribute_tensor(
                full, tensor.device_mesh, tensor.placements, src_data_rank=None
            )
            tensor.to_local().copy_(shard.to_local())
        else:
            tensor.copy_(full)


def build_materialized(
    workload: Workload, seed: int, device: torch.device | None = None
) -> nn.Module:
    """The whole model, unsharded, on one device (a single process's view of it)."""
    with torch.device("meta"):
        model = workload.build_model()
    materialize(model, workload.init, seed, device or torch.device("cpu"), workload.name)
    return model
