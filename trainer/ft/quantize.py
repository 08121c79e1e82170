"""Pseudo-gradients across groups in 8 bits (``ft.should_quantize``, the DiLoCo mode).

The exchange stays one summing all-reduce, in int8, so a failed sync fails as any
other and every group ends with the same integers (bitwise alike, whatever the
order the sums arrive in). For that the groups share one scale per row (the last
dimension; one per tensor for a vector or a scalar): the largest magnitude of that
row in any group, exchanged first (a MAX all-reduce of one float per row). Each
group rounds its row to ``levels(groups)`` steps of that scale on either side of 0,
so that the sum of every group's integers still fits in int8: with ``G`` groups at
most, ``127 // G`` levels each (63 for two groups, 42 for three, 15 for eight).
Rounding is to the nearest level; the error of one value is at most half a step,
``max / (2 * levels)``.

Pure torch: the exchanges themselves are the replication's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

INT8_MAX = 127


def levels(groups: int) -> int:
    """Steps either side of zero for each of at most `groups` groups (at least 1)."""
    return max(1, INT8_MAX // max(1, groups))


def row_maxima(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The largest magnitude of each row of each tensor, float32 (a vector or a scalar
    is one row)."""
    return [_rows(t).abs().amax(dim=-1).float() for t in tensors]


def quantize(
    tensors: Sequence[torch.Tensor], maxima: Sequence[torch.Tensor], steps: int
) -> list[torch.Tensor]:
    """Each tensor as int8 multiples of its rows' step (``maxima / steps``): values in
    [-steps, steps] where `maxima` bounds the rows (a row whose maximum is 0 is 0)."""
    out = []
    for t, top in zip(tensors, maxima, strict=True):
        step = _step(top, steps).unsqueeze(-1)
        q = torch.round(_rows(t).float() / step).clamp_(-steps, steps)
        out.append(q.to(torch.int8).reshape(t.shape))
    return out


def dequantize(
    summed: Sequence[torch.Tensor],
    maxima: Sequence[torch.Tensor],
    steps: int,
    like: Sequence[torch.Tensor],
) -> None:
    """Write into each tensor of `like` the sum its int8 multiples in `summed` stand for."""
    for q, top, t in zip(summed, maxima, like, strict=True):
        step = _step(top, steps).unsqueeze(-1)
        t.copy_((_rows(q).float() * step).reshape(t.shape))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1) if t.dim() < 2 else t.reshape(-1, t.shape[-1])


def _step(top: torch.Tensor, steps: int) -> torch.Tensor:
    """Each row's step; 1 where the row is all zeros (any step rounds it to 0)."""
    step = top / steps
    return torch.where(step > 0, step, torch.ones_like(step))
