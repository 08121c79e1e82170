"""Which items each replica group and rank trains on at each step (the shares), and
the built-in token sources and the generic sampler over a workload's dataset.
"""

from __future__ import annotations

from trainer.data.shares import Quorum, RankPlan, group_share, rank_plan, split, step_items
from trainer.data.sources import (
    BigramCorpus,
    Sampler,
    StepData,
    SyntheticTokens,
    TokenWindows,
    WindowTokens,
    stack,
    token_dataset,
)

__all__ = [
    "BigramCorpus",
    "Quorum",
    "RankPlan",
    "Sampler",
    "StepData",
    "SyntheticTokens",
    "TokenWindows",
    "WindowTokens",
    "group_share",
    "rank_plan",
    "split",
    "stack",
    "step_items",
    "token_dataset",
]
