"""Finding a job's workload: the entry point that ``workload.spec`` names (its module
made importable from ``workload.python_path``), else the built-in Llama's, which is
reached the same way; and the
checks every workload's model and data pass before anything is built for real."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

import torch
from torch import nn

from trainer.config import ConfigError, TrainerConfig
from trainer.workloads.api import (
    BUILTIN,
    TP_STYLES,
    Workload,
    WorkloadContext,
    WorkloadError,
    matches,
)


def add_python_path(cfg: TrainerConfig) -> None:
    """Make workload.python_path importable in this process (a rank started by hand)."""
    for entry in reversed(cfg.workload.python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def load(cfg: TrainerConfig) -> Workload:
    """The job's workload: the named entry point's, else the built-in Llama's (BUILTIN),
    each called with the job's WorkloadContext."""
    ctx = WorkloadContext.of(cfg)
    add_python_path(cfg)
    entry = cfg.workload.spec or BUILTIN
    where = f"workload.spec {entry!r}"
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # an ImportError, or anything the module raises on import
        raise WorkloadError(
            f"{where}: module {module_name!r} does not import ({type(e).__name__}: {e}); "
            "check workload.python_path and the module."
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(
            f"{where}: module {module_name!r} has no callable {attr!r}; name a function that "
            "returns a trainer.workloads.Workload."
        )
    try:
        spec = factory(ctx)
    except ConfigError:
        raise
    except Exception as e:
        raise WorkloadError(
            f"{where} raised {type(e).__name__}: {e}; fix the entry point or workload.options."
        ) from None
    if not isinstance(spec, Workload):
        raise WorkloadError(
            f"{where} returned a {type(spec).__name__}, not a trainer.workloads.Workload; "
            "return Workload(...)."
        )
    return spec


def build_meta(workload: Workload, where: str) -> nn.Module:
    """The whole model on the meta device (shapes only), checked against the spec."""
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except Exception as e:
        raise WorkloadError(
            f"{where}: build_model raised {type(e).__name__}: {e}; fix the model's constructor "
            "(it runs on the meta device: no data may be read from its tensors)."
        ) from None
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"{where}: build_model returned a {type(model).__name__}, not an nn.Module."
        )
    check_model(workload, model, where)
    return model


def probe_data(workload: Workload, where: str) -> None:
    """Two items of each dataset must collate into an (input, target) pair of tensors."""
    from trainer.data.sources import stack

    collate = workload.collate or stack
    for label, data in (("train_data", workload.train_data), ("eval_data", workload.eval_data)):
        if data is None:
            continue
        try:
            batch = collate([data[0], data[1]])
        except Exception as e:
            raise WorkloadError(
                f"{where}: items of {label} do not collate ({type(e).__name__}: {e}); make "
                "dataset[i] return (input, target) tensors of one shape, or give a collate."
            ) from None
        if not (
            isinstance(batch, tuple)
            and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)
        ):
            raise WorkloadError(
                f"{where}: {label} collates to {type(batch).__name__}, not an (input, target) "
                "pair of tensors; return (input, target) from dataset[i] or from collate."
            )


def check_model(workload: Workload, model: nn.Module, where: str) -> None:
    """What can be checked on the meta model before anything is allocated."""
    names = {name for name, _ in model.named_modules()}
    plan = workload.tp_plan
    if isinstance(plan, Mapping):
        for path, style in plan.items():
            if not any(matches(path, name) for name in names):
                raise WorkloadError(
                    f"{where}: tp_plan names {path!r}, which the model does not have; "
                    "use module paths from model.named_modules()."
                )
            if isinstance(style, str) and style not in TP_STYLES:
                raise WorkloadError(
                    f"{where}: tp_plan gives {path!r} the style {style!r}; use one of "
                    f"{', '.join(TP_STYLES)} or a torch ParallelStyle."
                )
    if not isinstance(workload.shard_units, type):
        for path in workload.shard_units:
            if not any(matches(path, name) for name in names):
                raise WorkloadError(
                    f"{where}: shard_units names {path!r}, which the model does not have; "
                    "use module paths from model.named_modules()."
                )
    for point in workload.split_points:
        if point not in names:
            raise WorkloadError(
                f"{where}: split point {point!r} is not a module of the model; name entries "
                f"of the trunk ({workload.trunk or 'workload.trunk is unset'})."
            )
