"""A standby's device warm-up: on a CUDA job, what every rank's start pays before its
first step and needs no start's environment for.

On a GPU a cold rank paid for its CUDA context, the CUDA libraries' handles (cuBLAS for
the first matrix product, the fused optimizer's kernels) and the caching allocator's
first blocks before it could heal: 10.4 s from a cold start to the heal on an H200
(docs/benchmarks.md). A standby does that while it waits, on the device its local rank
will train on, so an assigned standby starts as warm on the GPU as on a CPU.

It runs in the standby itself, never in the zygote that forks standbys
(trainer/spares/zygote.py): a CUDA context does not survive a fork, so a process that
forks must not have one. Nothing here may fail the standby: the rank meets any problem
again and reports it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from trainer.config import TrainerConfig, load_trainer_config
from trainer.config import env as rank_vars

FIRST_USE_WIDTH = 256  # a matrix product big enough to load cuBLAS's kernels


def job_device(cfg: TrainerConfig) -> str:
    """The device kind the job's ranks train on: "cuda" or "cpu" (auto resolved here)."""
    import torch

    kind = cfg.parallel.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    return kind


def first_use(device: Any, bf16: bool) -> None:
    """A forward, a backward and a fused AdamW step on `device`, in bf16 autocast where
    the job trains so, and a wait for them: what the first training step would load."""
    import torch

    model = torch.nn.Linear(FIRST_USE_WIDTH, FIRST_USE_WIDTH, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), fused=device.type == "cuda")
    inputs = torch.ones(8, FIRST_USE_WIDTH, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(inputs).float().square().mean()
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_device(config_path: str, cfg: TrainerConfig | None, world_size: int) -> str | None:
    """On a CUDA job: make this process's CUDA context on cuda:LOCAL_RANK and run
    :func:`first_use` there. Returns the device warmed ("cuda:N"), or None (a CPU job, a
    job file that does not load, or any failure)."""
    if cfg is None:
        with contextlib.suppress(Exception):
            cfg = load_trainer_config(config_path, [], world_size)
    if cfg is None:
        return None
    try:
        if job_device(cfg) != "cuda":
            return None
        import torch

        device = torch.device("cuda", int(os.environ.get(rank_vars.LOCAL_RANK, "0")))
        torch.cuda.set_device(device)
        first_use(device, bf16=cfg.parallel.param_dtype == "bfloat16")
    except Exception:
        return None
    return str(device)
