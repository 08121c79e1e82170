"""AdamW, warmup + cosine learning rate, and gradient clipping across a parallel layout."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over warmup_steps, then cosine decay to min_lr at cfg.steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> AdamW:
    return AdamW(
        list(params),
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
    """Total gradient norm over the whole model (all shards, all pipeline stages); clip if max_norm > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if isinstance(norm, DTensor):  # sharded grads: reduce the partial norms
        norm = norm.full_tensor()
    if pp_group is not None:  # each stage holds different parameters
        norm = norm**2
        dist.all_reduce(norm, group=pp_group)
        norm = norm**0.5
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return float(norm)


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
