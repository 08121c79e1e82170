"""A workload that is not a language model: a residual MLP regressing a fixed random
"teacher" function of generated inputs. It lives outside the repository's packages;
a job file reaches it with

    [workload]
    spec = "regression_workload:spec"
    python_path = ["."]  # beside the job file

and sets its options in [workload.options] (see OPTIONS below).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.workloads import Workload, WorkloadContext

OPTIONS = {"inputs": 16, "width": 64, "depth": 4, "items": 4096, "noise": 0.01, "teacher": 7}


class Block(nn.Module):
    """x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return out


class ResidualMLP(nn.Module):
    """Parts a pipeline stage does not hold are None and skipped."""

    def __init__(self, inputs: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed: nn.Linear | None = nn.Linear(inputs, width)
        self.blocks = nn.ModuleDict({str(i): Block(width) for i in range(depth)})
        self.head: nn.Linear | None = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        return self.head(h).squeeze(-1) if self.head is not None else h


class TeacherData:
    """Item i: x ~ N(0, 1) drawn from a generator seeded by (seed, i), and
    y = sin(2 x . w) + noise for the teacher's fixed random w. Finite: the sampler wraps."""

    def __init__(self, inputs: int, items: int, noise: float, seed: int, teacher: int) -> None:
        self.inputs, self.items, self.noise, self.seed = inputs, items, noise, seed
        self.teacher = torch.randn(inputs, generator=torch.Generator().manual_seed(teacher))
        self.teacher /= math.sqrt(inputs)

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.inputs, generator=gen)
        y = torch.sin(2 * (x @ self.teacher)) + self.noise * torch.randn((), generator=gen)
        return x, y


def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(like.shape)
    if name.endswith("bias"):
        return torch.zeros(like.shape)
    scale = 0.1 if name.endswith(("fc2.weight", "head.weight")) else 1.0  # quiet residuals
    return torch.randn(like.shape, generator=gen) * scale / math.sqrt(like.shape[-1])


def no_decay_for_norms_and_biases(params: Mapping[str, nn.Parameter]) -> list[dict[str, Any]]:
    plain = [p for n, p in params.items() if n.endswith("bias") or ".norm." in n]
    decayed = [p for n, p in params.items() if not (n.endswith("bias") or ".norm." in n)]
    return [{"params": decayed}, {"params": plain, "weight_decay": 0.0}]


def spec(ctx: WorkloadContext) -> Workload:
    unknown = set(ctx.options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown workload.options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    o = {**OPTIONS, **ctx.options}
    inputs, width, depth = int(o["inputs"]), int(o["width"]), int(o["depth"])
    teacher = int(o["teacher"])
    return Workload(
        name="regression",
        build_model=lambda: ResidualMLP(inputs, width, depth),
        init=init,
        loss=F.mse_loss,
        train_data=TeacherData(inputs, int(o["items"]), float(o["noise"]), ctx.seed, teacher),
        eval_data=TeacherData(inputs, 256, 0.0, ctx.seed + 1_000_003, teacher),  # held out
        shard_units=["blocks.*"],
        tp_plan={"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"},
        trunk="blocks",
        param_groups=no_decay_for_norms_and_biases,
    )
