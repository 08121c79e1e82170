"""An in-process Checkpointer over a small real model, for tests of the saver's decisions."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.checkpoint.saver import Checkpointer
from trainer.config import CheckpointConfig
from trainer.config.env import RankEnv
from trainer.ft.replication import SingleGroup
from trainer.ft.state import TrainState
from trainer.metrics import TrainMetrics


def linear_checkpointer(root: Path, width: int = 256) -> tuple[Checkpointer, torch.nn.Linear]:
    """A Checkpointer (one rank, no process group, asynchronous saves) of a Linear layer
    with Adam's state: width 256 is 257 KB of parameters, 771 KB in all."""
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, width)).sum().backward()
    optimizer.step()
    state = TrainState(
        dict(model.named_parameters()),
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
    )
    cfg = CheckpointConfig.model_validate({"dir": str(root), "async": True})
    saver = Checkpointer(
        cfg, root, state, SingleGroup(state), TrainMetrics(RankEnv()), "h", {}, rank=0
    )
    return saver, model
