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
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from trainer.workloads import InitFn, Workload, WorkloadError


def stable_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one tensor: the same on every rank and in every layout."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def materialize(
    model: nn.Module, init: InitFn, seed: int, device: torch.device, where: str
) -> None:
    # to_empty allocates without touching the pages; filling the largest tensors first
    # means each transient full tensor is made while little of the rest is resident, so
    # the peak stays near the local shards plus one tensor.
    model.to_empty(device=device)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in sorted(tensors, key=lambda item: -item[1].numel()):
        gen = torch.Generator().manual_seed(stable_seed(seed, name))
        full = init(name, tensor, gen)
        if not isinstance(full, torch.Tensor) or tuple(full.shape) != tuple(tensor.shape):
            got = tuple(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
            raise WorkloadError(
                f"{where}: init returned {got} for {name!r}, whose shape is "
                f"{tuple(tensor.shape)}; return the full tensor for every parameter and buffer."
            )
        if isinstance(tensor, DTensor):
            tensor.to_local().copy_(_local_part(full, tensor))
        else:
            tensor.copy_(full)
        del full


def _local_part(full: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This rank's part of `full` under `like`'s placements: a view, no copy."""
    shape, offset = compute_local_shape_and_global_offset(
        full.shape, like.device_mesh, like.placements
    )
    return full[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]


def build_materialized(
    workload: Workload, seed: int, device: torch.device | None = None
) -> nn.Module:
    """The whole model, unsharded, on one device (a single process's view of it)."""
    with torch.device("meta"):
        model = workload.build_model()
    materialize(model, workload.init, seed, device or torch.device("cpu"), workload.name)
    return model
