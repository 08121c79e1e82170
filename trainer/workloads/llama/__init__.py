"""The built-in Llama-style decoder (`model`) and its workload (`workload`), reached
through its entry point ``trainer.workloads.llama:llama`` like any user's: the token
sources of [data], the init, the tensor-parallel plan and the pipeline cuts.
"""

from __future__ import annotations

from trainer.workloads.llama.model import Block, Transformer
from trainer.workloads.llama.workload import (
    cross_entropy,
    llama,
    llama_init,
    llama_workload,
    split_layers,
    tp_plan,
)

__all__ = [
    "Block",
    "Transformer",
    "cross_entropy",
    "llama",
    "llama_init",
    "llama_workload",
    "split_layers",
    "tp_plan",
]
