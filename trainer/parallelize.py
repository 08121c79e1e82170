"""Parallelism inside a replica group, applied by explicit functions in a fixed order:
tensor parallel, activation checkpointing, compile, FSDP2. Pipeline splitting happens
before (pipeline.py builds the stage modules these functions then parallelize).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainer.config import ParallelConfig
from trainer.mesh import Layout
from trainer.model import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def apply_tp(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Megatron-style column/row sharding with sequence-parallel norms.

    Between blocks the activations are sharded on the sequence dimension; each
    attention and MLP gathers the sequence, works on its shard of heads / hidden
    units, and reduce-scatters back to sequence shards.
    """
    top: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )


def apply_ac(model: Transformer) -> None:
    for block in model.layers.values():
        block.recompute = True  # type: ignore[assignment]


def apply_compile(model: Transformer) -> None:
    for block in model.layers.values():
        block.compile()


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, cfg: ParallelConfig) -> None:
    """fully_shard each block, then the root (embeddings, final norm, output)."""
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )
    # With pipelining, each microbatch would all-gather again; keep params gathered.
    reshard = cfg.pp == 1
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)


def parallelize(model: Transformer, cfg: ParallelConfig, layout: Layout) -> Transformer:
    model.to(layout.device)
    tp_mesh = layout.sub("tp")
    if tp_mesh is not None:
        apply_tp(model, tp_mesh)
    if cfg.activation_checkpointing == "full":
        apply_ac(model)
    if cfg.compile:
        apply_compile(model)
    dp_mesh = layout.sub("dp_shard")
    if dp_mesh is not None:
        apply_fsdp(model, dp_mesh, cfg)
    return model


def autocast_dtype(cfg: ParallelConfig, layout: Layout) -> torch.dtype | None:
    """Without FSDP, bf16 params mean autocast; FSDP's MixedPrecisionPolicy handles it otherwise."""
    if cfg.param_dtype == "float32" or layout.sub("dp_shard") is not None:
        return None
    return DTYPES[cfg.param_dtype]
