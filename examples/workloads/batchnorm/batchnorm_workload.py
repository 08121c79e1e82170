"""A workload with buffers: an MLP classifier with BatchNorm, whose running statistics
(``running_mean``, ``running_var``, ``num_batches_tracked``) change in every training
forward and are what evaluation normalises with. It lives outside the repository's
packages; a job file reaches it with

    [workload]
    spec = "batchnorm_workload:spec"
    python_path = ["."]  # beside the job file

and sets its options in [workload.options] (see OPTIONS below). Phalanx keeps the
buffers of every replica group equal (docs/workloads.md, "Buffers").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.workloads import Workload, WorkloadContext

OPTIONS = {"inputs": 8, "width": 32, "classes": 4, "items": 4096, "scale": 3.0}


class BatchNormMLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU, twice, then a linear head."""

    def __init__(self, inputs: int, width: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inputs, width)
        self.bn1 = nn.BatchNorm1d(width)
        self.fc2 = nn.Linear(width, width)
        self.bn2 = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.fc1(x)))
        h = F.relu(self.bn2(self.fc2(h)))
        out: torch.Tensor = self.head(h)
        return out


class Blobs:
    """Item i: x ~ N(0, 1) * scale + an offset (so the statistics BatchNorm tracks are
    far from their initial 0 and 1), drawn from a generator seeded by (seed, i); the class
    is which of `classes` fixed random directions x is nearest to."""

    def __init__(self, inputs: int, classes: int, items: int, scale: float, seed: int) -> None:
        self.inputs, self.items, self.scale, self.seed = inputs, items, scale, seed
        self.centres = torch.randn(classes, inputs, generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.inputs, generator=gen) * self.scale + 1.0
        y = torch.argmax(self.centres @ (x - 1.0))
        return x, y


def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Parameters drawn from `gen`; the BatchNorm buffers as BatchNorm starts them."""
    if name.endswith(("running_mean", "bias")):
        return torch.zeros(like.shape, dtype=like.dtype)
    if name.endswith(("running_var", "bn1.weight", "bn2.weight")):
        return torch.ones(like.shape, dtype=like.dtype)
    if name.endswith("num_batches_tracked"):
        return torch.zeros(like.shape, dtype=like.dtype)
    return torch.randn(like.shape, generator=gen) / math.sqrt(like.shape[-1])


def spec(ctx: WorkloadContext) -> Workload:
    unknown = set(ctx.options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown workload.options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    o = {**OPTIONS, **ctx.options}
    inputs, width, classes = int(o["inputs"]), int(o["width"]), int(o["classes"])
    scale = float(o["scale"])
    return Workload(
        name="batchnorm",
        build_model=lambda: BatchNormMLP(inputs, width, classes),
        init=init,
        loss=F.cross_entropy,
        train_data=Blobs(inputs, classes, int(o["items"]), scale, ctx.seed),
        eval_data=Blobs(inputs, classes, 256, scale, ctx.seed + 1_000_003),  # held out
    )
