"""A workload whose compute runs at a fixed rate per item on its own "device": each
forward holds the rank for `ms_per_item` milliseconds per item (a sleep, as a GPU
kernel holds a stream) on top of a tiny MLP's real arithmetic.

bench/growth.py uses it to show how a group's step time follows its share of the
global batch. On this project's 2-core machines three groups share two cores, so with
real arithmetic alone a group that trains a third of each step instead of a half
still waits for the same cores; here each group's compute is its own, as it is on
hosts with one accelerator each.

    [workload]
    spec = "bench.fixed_rate_workload:spec"

    [workload.options]
    ms_per_item = 10
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from trainer.workloads import Workload, WorkloadContext

OPTIONS = {"ms_per_item": 10.0, "inputs": 8, "width": 16, "items": 4096}


class TimedMLP(nn.Module):
    """Two linear layers; forward first holds the rank for ms_per_item per row."""

    def __init__(self, inputs: int, width: int, ms_per_item: float) -> None:
        super().__init__()
        self.ms_per_item = ms_per_item
        self.fc1 = nn.Linear(inputs, width)
        self.fc2 = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms_per_item * x.shape[0] / 1000)
        out: torch.Tensor = self.fc2(F.gelu(self.fc1(x))).squeeze(-1)
        return out


class LinearData:
    """Item i: x ~ N(0, 1) from a generator seeded by (seed, i), y = sum(x)."""

    def __init__(self, inputs: int, items: int, seed: int) -> None:
        self.inputs, self.items, self.seed = inputs, items, seed

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.inputs, generator=gen)
        return x, x.sum()


def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("bias"):
        return torch.zeros(like.shape)
    out: torch.Tensor = torch.randn(like.shape, generator=gen) / float(like.shape[-1]) ** 0.5
    return out


def spec(ctx: WorkloadContext) -> Workload:
    unknown = set(ctx.options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown workload.options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    o = {**OPTIONS, **ctx.options}
    inputs, width, ms = int(o["inputs"]), int(o["width"]), float(o["ms_per_item"])
    return Workload(
        name="fixed-rate",
        build_model=lambda: TimedMLP(inputs, width, ms),
        init=init,
        loss=F.mse_loss,
        train_data=LinearData(inputs, int(o["items"]), ctx.seed),
    )
