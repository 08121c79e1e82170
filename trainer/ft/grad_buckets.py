"""Gradients packed into flat buckets for the all-reduce across replica groups, and how
the groups' tensors combine in it."""

from __future__ import annotations

from typing import Literal

import torch
from torch.distributed import AllreduceOptions, ReduceOp

Reduce = Literal["avg", "sum", "max"]  # how the groups' tensors combine


def reduce_options(op: Reduce, healing: bool = False) -> AllreduceOptions:
    """The all-reduce's options for `op`; a healing group's zeros go straight to the
    process group, summed where the others average (torchft's manager divides)."""
    opts = AllreduceOptions()
    chosen = ReduceOp.SUM if healing and op == "avg" else getattr(ReduceOp, op.upper())
    opts.reduceOp = chosen  # type: ignore[assignment]
    return opts


BUCKET_BYTES = 25 * 1024 * 1024


def buckets(tensors: list[torch.Tensor], cap_bytes: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Group tensors (in order, same dtype and device per bucket) into buckets of at most cap_bytes."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        last = out[-1] if out else None
        if (
            last is None
            or size + nbytes > cap_bytes
            or last[0].dtype != t.dtype
            or last[0].device != t.device
        ):
            out.append([t])
            size = nbytes
        else:
            last.append(t)
            size += nbytes
    return out
