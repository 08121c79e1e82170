"""What Phalanx trains: the workload API (`Workload`, `WorkloadContext`), the loader
that finds a job's entry point and checks its model and data, and the built-in Llama.
"""

from __future__ import annotations

from trainer.workloads.api import (
    TP_STYLES,
    Dataset,
    InitFn,
    Item,
    LossFn,
    Workload,
    WorkloadContext,
    WorkloadError,
    matching,
    units,
)
from trainer.workloads.loader import add_python_path, build_meta, check_model, load, probe_data

__all__ = [
    "TP_STYLES",
    "Dataset",
    "InitFn",
    "Item",
    "LossFn",
    "Workload",
    "WorkloadContext",
    "WorkloadError",
    "add_python_path",
    "build_meta",
    "check_model",
    "load",
    "matching",
    "probe_data",
    "units",
]
