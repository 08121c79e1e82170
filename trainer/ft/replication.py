"""Replication across replica groups: how gradients cross groups and when a step commits.

:class:`Replication` is what the loop needs from it. :class:`SingleGroup` is the trainer
without fault tolerance (no ``TORCHFT_LIGHTHOUSE``): every step commits.
:class:`~trainer.ft.torchft_group.TorchFTGroup` wires one ``torchft.Manager`` per group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from trainer.data.shares import Quorum
from trainer.ft.state import TrainState


class Replication(Protocol):
    def start_step(self) -> None: ...
    def current_step(self) -> int: ...
    def participants(self) -> int: ...
    def quorum(self) -> Quorum: ...
    def last_quorum(self) -> Quorum | None: ...
    def quorum_id(self) -> int | None: ...
    def is_writer(self) -> bool: ...
    def fresh_start(self) -> bool: ...
    def ft_state(self) -> dict[str, int]: ...
    def restore(self, step: int, ft_state: dict[str, int]) -> None: ...
    def hook_fsdp(self, modules: Iterable[torch.nn.Module]) -> None: ...
    def sync_gradients(self, grads: list[torch.Tensor]) -> bool: ...
    def should_commit(self, vote: bool = True) -> bool: ...
    def quorum_settles(self, seconds: float) -> bool: ...
    def across_groups(self, values: list[int]) -> tuple[list[int], list[int]]: ...
    def quorum_step(self) -> int: ...
    def average_across_groups(self, t: torch.Tensor) -> torch.Tensor | None: ...
    def shutdown(self) -> None: ...


# A group told to drain finishes its step only if the step's quorum forms within this
# long: when every node drains at once, the peers that quorum waits for may be gone.
DRAIN_QUORUM_WAIT_S = 3.0


class StepAbandoned(RuntimeError):
    """A draining group left a step whose quorum did not form; nothing of it was committed."""


class NonFiniteStep(RuntimeError):
    """A step whose loss or gradient norm is NaN or infinite: never committed."""


class SingleGroup:
    """No fault tolerance: one replica group, every step commits."""

    def __init__(self, state: TrainState) -> None:
        self.state = state

    def start_step(self) -> None:
        pass

    def current_step(self) -> int:
        return self.state.step

    def participants(self) -> int:
        return 1

    def quorum(self) -> Quorum:
        return Quorum(participants=1, rank=0)

    def last_quorum(self) -> Quorum | None:
        return Quorum(participants=1, rank=0)

    def quorum_id(self) -> int | None:
        return None

    def is_writer(self) -> bool:
        return True

    def fresh_start(self) -> bool:
        return True

    def ft_state(self) -> dict[str, int]:
        return {}

    def restore(self, step: int, ft_state: dict[str, int]) -> None:
        self.state.step = step

    def hook_fsdp(self, modules: Iterable[torch.nn.Module]) -> None:
        pass

    def sync_gradients(self, grads: list[torch.Tensor]) -> bool:
        return True  # the one group's gradients are already the average over the groups

    def should_commit(self, vote: bool = True) -> bool:
        if vote:
            self.state.step += 1
        return vote

    def quorum_settles(self, seconds: float) -> bool:
        return True

    def across_groups(self, values: list[int]) -> tuple[list[int], list[int]]:
        return list(values), list(values)

    def quorum_step(self) -> int:
        return self.state.step

    def average_across_groups(self, t: torch.Tensor) -> torch.Tensor | None:
        return None

    def shutdown(self) -> None:
        pass
