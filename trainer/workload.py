"""What Phalanx trains: a workload, returned by an entry point the job file names.

    [workload]
    spec = "my_pkg.train:spec"        # module:callable, importable on every rank
    python_path = ["/srv/my-workload"] # put on the ranks' PYTHONPATH by the daemon
    [workload.options]                 # free-form, handed to the entry point
    width = 256

The entry point is called as ``spec(ctx)`` with a :class:`WorkloadContext` and
returns a :class:`Workload`. Phalanx keeps everything else: which global item each
rank reads at each step (``data.Sampler``), parallelism, fault tolerance,
checkpoints and metrics. The built-in Llama (``trainer.llama``) is the workload
used when ``workload.spec`` is unset, written against this same API.

Contract of the model (see docs/workloads.md):

* ``build_model()`` is called under ``torch.device("meta")``: it creates shapes
  only. Phalanx parallelizes the meta model, allocates the local shards, and fills
  every parameter and buffer with ``init(name, like, generator)``: the *full*
  tensor for that name (``like`` has the global shape and dtype; ``generator`` is
  seeded by ``train.seed`` and the name). Each rank keeps its shard of it, so the
  initial parameters are the same whatever the layout.
* ``forward(input)`` returns what ``loss(output, target)`` takes.
* With pipeline parallelism, stages begin at ``split_points`` (entries of the
  ``nn.ModuleDict`` named by ``trunk``; by default the trunk is cut into equal
  runs). A stage keeps its trunk entries, the root's other children registered
  before the trunk go to the first stage and those after it to the last; the rest
  are set to ``None``, so ``forward`` must skip a child that is ``None`` and accept
  the previous stage's output in place of the input.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from trainer.config import ConfigError, TrainerConfig

Item = tuple[torch.Tensor, torch.Tensor]  # (input, target) of one training example
InitFn = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
TPPlan = Mapping[str, "str | ParallelStyle"] | Callable[[nn.Module, Any], None]
TP_STYLES = ("colwise", "rowwise", "sequence_parallel")


class Dataset(Protocol):
    """Map-style: item ``i`` -> (input, target). ``__len__`` is optional: without it
    every index is valid (an endless, generated source)."""

    def __getitem__(self, index: int) -> Any: ...


@dataclass(frozen=True)
class WorkloadContext:
    """What the entry point is told about the run."""

    options: Mapping[str, Any]  # [workload.options]
    seed: int  # train.seed
    seq_len: int  # train.seq_len (for sequence workloads)
    batch_size: int  # train.batch_size: items per micro-batch of one replica group


@dataclass(frozen=True)
class Workload:
    build_model: Callable[[], nn.Module]
    init: InitFn
    loss: LossFn
    train_data: Dataset
    eval_data: Dataset | None = None
    collate: Callable[[list[Any]], Item] | None = None  # default: stack inputs and targets
    shard_units: Sequence[str] | type[nn.Module] = ()  # FSDP2 units (paths may use *)
    tp_plan: TPPlan | None = None  # module path -> colwise/rowwise/sequence_parallel/style
    trunk: str | None = None  # the nn.ModuleDict a pipeline is cut along
    split_points: Sequence[str] = ()  # module paths where stages begin (default: equal runs)
    param_groups: Callable[[Mapping[str, nn.Parameter]], list[dict[str, Any]]] | None = None
    tokens_per_item: int = 1  # reported as tokens (seq_len for a language model)
    name: str = "workload"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the corpus entropy, logged


class WorkloadError(ConfigError):
    """A workload that cannot run; the message names the entry point and the fix."""


def add_python_path(cfg: TrainerConfig) -> None:
    """Make workload.python_path importable in this process (a rank started by hand)."""
    for entry in reversed(cfg.workload.python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def load(cfg: TrainerConfig) -> Workload:
    """The job's workload: the named entry point's, else the built-in Llama."""
    ctx = WorkloadContext(
        options=dict(cfg.workload.options),
        seed=cfg.train.seed,
        seq_len=cfg.train.seq_len,
        batch_size=cfg.train.batch_size,
    )
    if cfg.workload.spec is None:
        from trainer.llama import llama_workload

        return llama_workload(cfg)
    add_python_path(cfg)
    entry = cfg.workload.spec
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
            "returns a trainer.workload.Workload."
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
            f"{where} returned a {type(spec).__name__}, not a trainer.workload.Workload; "
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
    from trainer.data import stack

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
            if not any(_matches(path, name) for name in names):
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
            if not any(_matches(path, name) for name in names):
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


def _matches(pattern: str, name: str) -> bool:
    """A module path with ``*`` standing for one path component."""
    want, have = pattern.split("."), name.split(".")
    return len(want) == len(have) and all(w in ("*", h) for w, h in zip(want, have, strict=True))


def matching(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and _matches(pattern, n)]


def units(model: nn.Module, spec: Sequence[str] | type[nn.Module]) -> list[nn.Module]:
    """The modules named by shard_units (paths or a class), in model order, root excluded."""
    if isinstance(spec, type):
        return [m for n, m in model.named_modules() if n and isinstance(m, spec)]
    chosen = {id(m) for pattern in spec for _, m in matching(model, pattern)}
    return [m for n, m in model.named_modules() if n and id(m) in chosen]
