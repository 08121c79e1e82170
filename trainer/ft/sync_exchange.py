"""A DiLoCo sync's exchange across groups (trainer/round_loop.py): the pseudo-gradients
as they are, as bfloat16 (``ft.sync_bf16``) or as int8 (``ft.should_quantize``,
trainer/ft/quantize.py), beside the tensors that always cross at full width."""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.config import FaultToleranceConfig
from trainer.ft import quantize
from trainer.ft.grad_buckets import Reduce

Sync = Callable[[list[torch.Tensor], Reduce], bool]  # Replication.sync_gradients


def exchange(
    sync: Sync,
    ft: FaultToleranceConfig,
    groups: int,
    plain: list[torch.Tensor],
    moved: list[torch.Tensor],
) -> tuple[bool, int]:
    """Sum `plain` and the pseudo-gradients `moved` over the sync's groups, in place;
    (whether the sums went through, the bytes this rank sent). int8 first exchanges its
    rows' maxima; every group takes part in every exchange, whatever an earlier one came
    to (a healing group's say False). `groups`: the job's most (int8's levels)."""
    if ft.should_quantize:
        maxima = quantize.row_maxima(moved)
        ok = sync(maxima, "max")
        steps = quantize.levels(groups)
        wire = quantize.quantize(moved, maxima, steps)
    else:
        maxima = []
        wire = [m.to(torch.bfloat16) for m in moved] if ft.sync_bf16 else moved
        ok = True
    ok = sync([*plain, *wire], "sum") and ok
    if ft.should_quantize:
        quantize.dequantize(wire, maxima, steps, moved)
    elif wire is not moved:  # the sum as sent, in the parameters' dtype
        for m, w in zip(moved, wire, strict=True):
            m.copy_(w)
    return ok, sum(t.numel() * t.element_size() for t in (*maxima, *plain, *wire))
