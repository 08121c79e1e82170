"""A workload small enough to follow by hand: y = w . x with two weights and no bias,
mean squared error, and items whose every value is exact in float32.

tests/integration/test_diloco_reference.py trains it under real ranks and works out,
in plain floats, where DiLoCo must take it (``START``, ``item`` and the loss are what
that reference reads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.workloads import Workload, WorkloadContext

START = (0.5, -0.25)  # the weights before the first step
BIAS = 0.125  # the bias's, with the option


def item(index: int) -> tuple[tuple[float, float], float]:
    """Item `index`: (x, y), quarters and halves (exact in float32)."""
    x = ((index * 7) % 11 - 5) / 4, ((index * 3) % 7 - 3) / 2
    return x, (index % 5 - 2) / 4


class TwoWeights(nn.Module):
    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x).squeeze(-1)
        return out


class Items:
    """Map-style and endless: item i is :func:`item` (i)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = item(index)
        return torch.tensor(x), torch.tensor(y)


def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if name == "fc.bias":
        return torch.tensor([BIAS], dtype=like.dtype)
    if name != "fc.weight":
        raise ValueError(f"no start for {name}")
    return torch.tensor([START], dtype=like.dtype)


def spec(ctx: WorkloadContext) -> Workload:
    """Options: ``bias`` (false): a third weight, y = w . x + b (a second tensor)."""
    if set(ctx.options) - {"bias"}:
        raise ValueError(f"two_weight_workload takes only bias, got {sorted(ctx.options)}")
    bias = bool(ctx.options.get("bias", False))
    return Workload(
        name="two_weights",
        build_model=lambda: TwoWeights(bias),
        init=init,
        loss=F.mse_loss,
        train_data=Items(),
    )
