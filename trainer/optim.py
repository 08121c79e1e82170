"""AdamW, warmup + cosine learning rate, and gradient clipping across a parallel layout."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import ConfigError, TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over warmup_steps, then cosine decay to min_lr at cfg.steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


ParamGroups = Callable[[Mapping[str, torch.nn.Parameter]], list[dict[str, Any]]]


def build_optimizer(
    params: Mapping[str, torch.nn.Parameter], cfg: TrainConfig, groups: ParamGroups | None = None
) -> AdamW:
    """AdamW over every parameter; a workload's `param_groups` may split them into groups
    with their own options (e.g. weight_decay 0 for norms and biases)."""
    chosen: list[Any] = list(params.values())
    if groups is not None:
        chosen = groups(params)
        seen = [id(p) for group in chosen for p in group.get("params", [])]
        if sorted(seen) != sorted(id(p) for p in params.values()):
            raise ConfigError(
                "workload param_groups must place every parameter in exactly one group "
                f"({len(seen)} placements for {len(params)} parameters)."
            )
    return AdamW(
        chosen,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )


def build_scheduler(optimizer: AdamW, cfg: TrainConfig) -> LambdaLR:
    def factor(step: int) -> float:
        return lr_at(step, cfg) / cfg.lr

    return LambdaLR(optimizer, factor)


def clip_grad_norm(
    params: list[torch.nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None
) -> float:
    """Total gradient norm over the whole model (all shards, all pipeline stages); clip if
    max_norm > 0. Sharded (DTensor) and plain gradients may be mixed: a tensor-parallel
    plan need not cover every module (the others are replicated by value)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    parts = [
        part
        for part in (
            [p for p in with_grad if isinstance(p.grad, DTensor)],
            [p for p in with_grad if not isinstance(p.grad, DTensor)],
        )
        if part
    ]
    norms = [_norm([p.grad for p in part if p.grad is not None]) for part in parts]
    norm = norms[0] if len(norms) == 1 else torch.stack([n**2 for n in norms]).sum() ** 0.5
    if pp_group is not None:  # each stage holds different parameters
        norm = norm**2
        dist.all_reduce(norm, group=pp_group)
        norm = norm**0.5
    if max_norm > 0:
        for part in parts:
            torch.nn.utils.clip_grads_with_norm_(part, max_norm, norm, foreach=True)
    return float(norm)


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if isinstance(norm, DTensor):  # sharded grads: reduce the partial norms
        norm = norm.full_tensor()
    return norm


def init_optimizer_state(optimizer: AdamW) -> None:
    """Create AdamW's per-parameter state now, as its first step would (zeros, step 0).

    AdamW creates its state lazily in the first step. Creating the same tensors
    up front changes nothing numerically, and gives checkpoint loads and live
    healing tensors of the right layout to load into before any step ran.
    """
    from torch.optim.optimizer import _get_scalar_dtype

    for group in optimizer.param_groups:
        on_device = group["capturable"] or group["fused"]
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            scalar: torch.dtype = _get_scalar_dtype(is_fused=group["fused"])  # type: ignore[no-untyped-call]
            if on_device:
                state["step"] = torch.zeros((), dtype=scalar, device=p.device)
            else:
                state["step"] = torch.tensor(0.0, dtype=scalar, device="cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
