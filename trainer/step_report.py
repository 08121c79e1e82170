"""What one step attempt reports: what the step log, the metrics, evaluation and the
checkpointer each take whole (the loop's result, see trainer/loop.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncFigures:
    """What a DiLoCo round's sync cost and found (trainer/round_loop.py)."""

    every: int  # inner steps per sync (ft.sync_steps / ft.num_fragments)
    seconds: float  # the sync: its quorum, the exchange across groups and the commit
    bytes: int  # of the tensors it averaged across groups
    pseudo_norm: float | None  # the averaged pseudo-gradient's L2 norm (None: not committed)
    items_lost: int = 0  # items of the round no group trained (counted by the writer)
    items_partly_lost: int = 0  # streaming: earlier items the fragment synced never saw


@dataclass(frozen=True)
class StepReport:
    step: int  # committed steps after this one (1 for the first step)
    committed: bool
    loss: float | None  # None when the group healed after this step's forward (stale parameters)
    lr: float
    grad_norm: float
    participants: int
    quorum_id: int | None
    seconds: float
    tokens: int  # tokens this group trained on in the step
    items: range = range(0)  # the step's items this group trained on (empty unless committed)
    finite: bool = True  # False: a NaN/inf loss or gradient norm voted the step down
    diverged: bool = False  # the groups' parameters differed (this group is in the majority)
    quorum_s: float = 0.0  # of `seconds`: waiting for the quorum to form (a heal included)
    sync: SyncFigures | None = None  # a DiLoCo round's sync (None: every-step mode)
