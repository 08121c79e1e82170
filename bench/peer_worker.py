"""What the peer workers share: the model, data and optimizer of bench/peer_settings.py,
built from the Phalanx trainer's own pieces, one step's gradients, and the step log.

The model is the trainer's Llama initialised exactly as the trainer initialises it
(trainer/parallel/materialize.py, seeded by train.seed and each tensor's name), the data its
step-indexed sampler over the synthetic corpus, the optimizer its AdamW with the
warmup + cosine learning rate and gradient clipping at train.max_grad_norm.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn
from torch.optim import AdamW

from bench.peer_settings import trainer_config
from trainer.config import TrainerConfig
from trainer.data.sources import Sampler
from trainer.optim import build_optimizer, init_optimizer_state, lr_at
from trainer.parallel.materialize import build_materialized
from trainer.workloads.llama.workload import cross_entropy, llama_workload


@dataclass
class Parts:
    cfg: TrainerConfig
    model: nn.Module
    optimizer: AdamW
    sampler: Sampler
    index: int  # this rank's data shard ...
    count: int  # ... of this many: step s reads items (s*count + index)*batch_size + row


def build(index: int, count: int) -> Parts:
    """Model, optimizer and this rank's sampler (`index` of `count` data shards)."""
    torch.set_num_threads(1)
    cfg = trainer_config()
    torch.manual_seed(cfg.train.seed)
    work = llama_workload(cfg)
    model = build_materialized(work, cfg.train.seed)
    optimizer = build_optimizer(dict(model.named_parameters()), cfg.train)
    init_optimizer_state(optimizer)  # so a checkpoint or a heal loads into existing tensors
    sampler = Sampler(work.train_data)
    return Parts(cfg, model, optimizer, sampler, index, count)


def gradients(parts: Parts, forward: nn.Module, step: int) -> float:
    """Forward and backward of this rank's rows of `step`; returns the loss."""
    size = parts.cfg.train.batch_size
    first = (
        step * parts.count + parts.index
    ) * size  # Phalanx's share with global batch count*size
    batch = parts.sampler.take(range(first, first + size), torch.device("cpu"))
    for p in parts.model.parameters():
        p.grad = None
    loss = cross_entropy(forward(batch.inputs), batch.targets)
    loss.backward()  # type: ignore[no-untyped-call]
    return float(loss.detach())


def clip_and_step(parts: Parts, step: int) -> None:
    """Clip at train.max_grad_norm, set the learning rate of `step`, step AdamW."""
    torch.nn.utils.clip_grad_norm_(parts.model.parameters(), parts.cfg.train.max_grad_norm)
    for group in parts.optimizer.param_groups:
        group["lr"] = lr_at(step, parts.cfg.train)
    parts.optimizer.step()


class StepLog:
    """One JSON line per event in this process's own file, flushed at once."""

    def __init__(self, directory: str, name: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / f"{name}-{os.getpid()}.jsonl"
        self.out: IO[str] = path.open("a", buffering=1)

    def write(self, **fields: Any) -> None:
        self.out.write(json.dumps({"t": time.time(), **fields}) + "\n")
        self.out.flush()
