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
from trainer.ft.grad_buckets import Reduce
from trainer.ft.state import TrainState


class StepLifecycle(Protocol):
    """One step attempt's life across groups: begin it, commit it or not, and leave."""

    def start_step(self) -> None:
        """Begin a step attempt: ask for its quorum (torchft may heal this group in it)."""
        ...

    def current_step(self) -> int:
        """Returns: the committed steps so far; the attempt under way is step + 1."""
        ...

    def should_commit(self, vote: bool = True) -> bool:
        """Args: vote: this rank's vote (False: its loss or gradient norm is not finite).

        Returns: whether every rank of every participating group voted yes; the step
        count advances when it did."""
        ...

    def quorum_settles(self, seconds: float) -> bool:
        """Args: seconds: how long to wait for this step's quorum.

        Returns: whether it formed (neither pending nor failed) in that time."""
        ...

    def take_heals(self) -> list[float]:
        """Returns: how long each heal since the last call took, from its step's start to
        the peer's state applied (an empty list when none came)."""
        ...

    def take_join_timeouts(self) -> int:
        """Returns: the quorums since the last call that waited out the lighthouse's join
        timeout for members of the quorum before (trainer.ft.quorum_watch)."""
        ...

    def take_waited(self) -> float:
        """Returns: the seconds this rank spent waiting on other groups (a quorum not yet
        formed, a cross-group collective) since the last call (see trainer/ft/straggler.py)."""
        ...

    def take_quorum_wait(self) -> float:
        """Returns: the seconds this rank waited for a quorum to form (a heal in it
        included) since the last call: part of :meth:`take_waited`, for the step's end
        event (trainer.contracts.rank_events.QUORUM_S)."""
        ...

    def shutdown(self) -> None:
        """Leave the quorum for good (the last step has been committed or abandoned)."""
        ...


class QuorumView(Protocol):
    """What this step's quorum says about the groups in it."""

    def participants(self) -> int:
        """Returns: how many groups take part in the last quorum."""
        ...

    def quorum(self) -> Quorum:
        """Returns: this step's quorum as the data contract needs it (waits for it)."""
        ...

    def last_quorum(self) -> Quorum | None:
        """Returns: this step's likely quorum before it forms (the previous one when it
        will repeat), or None when guessing would waste a forward."""
        ...

    def quorum_id(self) -> int | None:
        """Returns: the lighthouse's id of the last quorum (None without one)."""
        ...

    def quorum_step(self) -> int:
        """Returns: the step of this quorum's up-to-date groups (a healing group is behind)."""
        ...

    def is_writer(self) -> bool:
        """Returns: whether this group writes checkpoints (the lowest-id up-to-date one)."""
        ...

    def fresh_start(self) -> bool:
        """Returns: whether no participant of this quorum has committed a step yet."""
        ...


class CrossGroup(Protocol):
    """Collectives across the replica groups of this step's quorum."""

    def hook_fsdp(self, modules: Iterable[torch.nn.Module]) -> None:
        """Args: modules: the FSDP2 modules whose reduce-scatter output crosses groups."""
        ...

    def sync_gradients(self, grads: list[torch.Tensor], op: Reduce = "avg") -> bool:
        """Args: grads: unsharded gradients to average across groups, in place; op: or
        to sum them (integers too), or take their element-wise maximum.

        Returns: whether they were reduced (False: the exchange failed or this group
        only heals in this step, and `grads` are this group's own)."""
        ...

    def average_across_groups(self, t: torch.Tensor) -> torch.Tensor | None:
        """Args: t: a tensor to average like gradients.

        Returns: the average, or None when this group only heals or the exchange failed."""
        ...

    def across_groups(self, values: list[int]) -> tuple[list[int], list[int]]:
        """Args: values: this group's integers.

        Returns: their element-wise minimum and maximum over every group of the quorum."""
        ...


class ResumableState(Protocol):
    """The fault-tolerance state a checkpoint keeps beside the training state."""

    def ft_state(self) -> dict[str, int]:
        """Returns: what must be saved to resume the groups' step count (torchft's)."""
        ...

    def restore(self, step: int, ft_state: dict[str, int]) -> None:
        """Args: step: the loaded checkpoint's step; ft_state: what ft_state() saved."""
        ...


class Comparing(QuorumView, CrossGroup, Protocol):
    """What comparing the groups' parameters needs: who writes, and an average across groups."""


class Checkpointing(QuorumView, CrossGroup, ResumableState, Protocol):
    """What saving and resuming need: who writes, agreement across groups, the ft state."""


class Replication(StepLifecycle, QuorumView, CrossGroup, ResumableState, Protocol):
    """All of it: what the training loop drives (SingleGroup, TorchFTGroup)."""


# A group told to drain finishes its step only if the step's quorum forms within this
# long: when every node drains at once, the peers that quorum waits for may be gone.
DRAIN_QUORUM_WAIT_S = 3.0


class StepAbandoned(RuntimeError):
    """A draining group left a step whose quorum did not form; nothing of it was committed."""


def leave_unless_formed(formed: bool) -> None:
    """The one way a draining group leaves a step: when its quorum did not form in
    DRAIN_QUORUM_WAIT_S (`formed` False), nothing of the step may be committed.

    Raises: StepAbandoned, caught by the loop, which logs ``step_abandoned`` and stops."""
    if not formed:
        raise StepAbandoned(
            f"draining, and the step's quorum did not form in {DRAIN_QUORUM_WAIT_S} s"
        )


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

    def sync_gradients(self, grads: list[torch.Tensor], op: Reduce = "avg") -> bool:
        return True  # the one group's average, sum and maximum are its own

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

    def take_heals(self) -> list[float]:
        return []

    def take_join_timeouts(self) -> int:
        return 0

    def take_waited(self) -> float:
        return 0.0

    def take_quorum_wait(self) -> float:
        return 0.0

    def shutdown(self) -> None:
        pass
