"""What Phalanx trains: a workload, returned by an entry point the job file names.

    [workload]
    spec = "my_pkg.train:spec"        # module:callable, importable on every rank
    python_path = ["/srv/my-workload"] # put on the ranks' PYTHONPATH by the daemon
    [workload.options]                 # free-form, handed to the entry point
    width = 256

The entry point is called as ``spec(ctx)`` with a :class:`WorkloadContext` and
returns a :class:`Workload`. Phalanx keeps everything else: which global item each
rank reads at each step (``data.Sampler``), parallelism, fault tolerance,
checkpoints and metrics. The built-in Llama (``trainer.workloads.llama.workload``) is the workload
used when ``workload.spec`` is unset, written against this same API.

Contract of the model (see docs/workloads.md):

* ``build_model()`` is called under ``torch.device("meta")``: it creates shapes
  only. Phalanx parallelizes the meta model, allocates the local shards, and fills
  every parameter and buffer with ``init(name, like, generator)``: the *full*
  tensor for that name (``like`` has the global shape and dtype; ``generator`` is
  seeded by ``train.seed`` and the name). Each rank keeps its shard of it, so the
  initial parameters are the same whatever the layout.
* ``forward(input)`` returns what ``loss(output, target)`` takes.
* With context parallelism (``parallel.cp``), inputs and targets are [batch, sequence,
  ...], attention goes through ``F.scaled_dot_product_attention`` (causal, no mask), and
  every buffer indexed by position is named in ``position_buffers``.
* With pipeline parallelism, stages begin at ``split_points`` (entries of the
  ``nn.ModuleDict`` named by ``trunk``; by default the trunk is cut into equal
  runs). A stage keeps its trunk entries, the root's other children registered
  before the trunk go to the first stage and those after it to the last; the rest
  are set to ``None``, so ``forward`` must skip a child that is ``None`` and accept
  the previous stage's output in place of the input.
"""

from __future__ import annotations

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


# The built-in Llama's entry point: what a job without workload.spec trains.
BUILTIN = "trainer.workloads.llama:llama"


@dataclass(frozen=True)
class WorkloadContext:
    """What the entry point is told about the run."""

    options: Mapping[str, Any]  # [workload.options]; the built-in's: [model] and [data]
    seed: int  # train.seed
    seq_len: int  # train.seq_len (for sequence workloads)
    batch_size: int  # train.batch_size: items per micro-batch of one replica group
    stages: int = 1  # pipeline stages (parallel.pp x stages per rank; 1 without a pipeline)

    @classmethod
    def of(cls, cfg: TrainerConfig) -> WorkloadContext:
        """The context a job gives its entry point (the built-in is given [model] and
        [data] as its options, so its job files stay as they are)."""
        p = cfg.parallel
        if cfg.workload.spec is None:
            options: dict[str, Any] = {
                "model": cfg.model.model_dump(),
                "data": cfg.data.model_dump(),
            }
        else:
            options = dict(cfg.workload.options)
        return cls(
            options=options,
            seed=cfg.train.seed,
            seq_len=cfg.train.seq_len,
            batch_size=cfg.train.batch_size,
            stages=p.pp * p.stages_per_rank if p.pp > 1 else 1,
        )


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
    # Buffers whose first dimension is the position (rotary tables, position ids): with
    # parallel.cp > 1 each cp rank sees its positions' rows (trainer/parallel/context.py).
    position_buffers: Sequence[str] = ()
    name: str = "workload"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the corpus entropy, logged


class WorkloadError(ConfigError):
    """A workload that cannot run; the message names the entry point and the fix."""


def matches(pattern: str, name: str) -> bool:
    """A module path with ``*`` standing for one path component."""
    want, have = pattern.split("."), name.split(".")
    return len(want) == len(have) and all(w in ("*", h) for w, h in zip(want, have, strict=True))


def matching(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and matches(pattern, n)]


def units(model: nn.Module, spec: Sequence[str] | type[nn.Module]) -> list[nn.Module]:
    """The modules named by shard_units (paths or a class), in model order, root excluded."""
    if isinstance(spec, type):
        return [m for n, m in model.named_modules() if n and isinstance(m, spec)]
    chosen = {id(m) for pattern in spec for _, m in matching(model, pattern)}
    return [m for n, m in model.named_modules() if n and id(m) in chosen]
