"""``params_sha256``: one digest of the full (unsharded) parameters, comparable across groups
(``train_done`` also reports ``buffers_sha256``: the same digest of the persistent buffers).

Each parameter is gathered to its full tensor, hashed with its name, dtype and
shape, and the per-parameter digests are hashed again in sorted-name order.
Pipeline stages exchange only their 64-character digests. Two replica groups
(or two runs) have equal digests exactly when every parameter is bitwise equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _entry(tensor: torch.Tensor) -> str:
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    data = full.detach().cpu().contiguous()
    raw = data.reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{data.dtype}:{tuple(data.shape)}:{hashlib.sha256(raw).hexdigest()}"


def params_sha256(
    params: Mapping[str, torch.Tensor], pp_group: dist.ProcessGroup | None = None
) -> str:
    """Collective within the replica group: every rank must call it."""
    entries = {name: _entry(p) for name, p in sorted(params.items())}
    if pp_group is not None:
        gathered: list[dict[str, str] | None] = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(gathered, entries, group=pp_group)
        entries = {k: v for part in gathered if part for k, v in part.items()}
    blob = "\n".join(f"{name}={entry}" for name, entry in sorted(entries.items()))
    return hashlib.sha256(blob.encode()).hexdigest()
