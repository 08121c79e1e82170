"""The built-in workload: the Llama-style decoder of model.py on a [data] token source.

It is what a job without ``workload.spec`` trains, reached like a user's workload:
the loader calls its entry point, :func:`llama`, with the job's WorkloadContext, whose
options are the job file's ``[model]`` and ``[data]`` sections.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from trainer.config import DataConfig, ModelConfig, TrainerConfig, validate
from trainer.data.sources import SyntheticTokens, WindowTokens, token_dataset
from trainer.workloads.api import InitFn, Workload, WorkloadContext
from trainer.workloads.llama.model import Block, Transformer, rope_tables


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over every position; logits [B, L, V], targets [B, L]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def llama_init(cfg: ModelConfig) -> InitFn:
    """Full-tensor init by name: normal(0, init_std) weights, scaled by depth for the
    residual projections (wo, w2); norms 1; the RoPE tables computed."""
    depth_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)

    def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if name == "rope_cos":
            return cos
        if name == "rope_sin":
            return sin
        if name.endswith("norm.weight"):
            return torch.ones(like.shape)
        std = depth_std if name.endswith(("wo.weight", "w2.weight")) else cfg.init_std
        return torch.randn(like.shape, generator=gen).mul_(std)  # in place: one full tensor

    return init


def tp_plan() -> dict[str, str | ParallelStyle]:
    """Megatron-style column/row sharding with sequence-parallel norms: between blocks the
    activations are sharded on the sequence dimension; each attention and MLP gathers
    the sequence, works on its shard of heads / hidden units, and reduce-scatters back."""
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
        ),
        "layers.*.attention.wq": "colwise",
        "layers.*.attention.wk": "colwise",
        "layers.*.attention.wv": "colwise",
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "layers.*.feed_forward.w1": "colwise",
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": "colwise",
    }


def split_layers(n_layers: int, n_stages: int) -> list[list[int]]:
    """Consecutive, near-equal runs of block ids; earlier stages take the remainder."""
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for stage in range(n_stages):
        size = base + (1 if stage < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


EVAL_SEED_OFFSET = 1_000_003  # evaluation items: other walks / windows than training's


def held_out(data: SyntheticTokens | WindowTokens, seed: int) -> SyntheticTokens | WindowTokens:
    """The same source read with another seed: distinct walks of the synthetic chain, or
    windows at another offset of the file."""
    if isinstance(data, SyntheticTokens):
        return SyntheticTokens(data.corpus, data.seq_len, seed + EVAL_SEED_OFFSET)
    return WindowTokens(data.windows, seed + EVAL_SEED_OFFSET)


def llama(ctx: WorkloadContext) -> Workload:
    """The entry point (``trainer.workloads.llama:llama``). Options: ``model`` and
    ``data``, the fields of [model] and [data], which a job without workload.spec gives."""
    m = validate(ModelConfig, ctx.options.get("model", {}), "workload.options.model")
    d = validate(DataConfig, ctx.options.get("data", {}), "workload.options.data")
    data = token_dataset(d, m.vocab_size, ctx.seq_len, ctx.seed)
    stages = split_layers(m.n_layers, ctx.stages) if ctx.stages > 1 else []
    return Workload(
        name="llama",
        build_model=lambda: Transformer(m),
        init=llama_init(m),
        loss=cross_entropy,
        train_data=data,
        eval_data=held_out(data, ctx.seed),
        shard_units=Block,
        tp_plan=tp_plan(),
        trunk="layers",
        split_points=[f"layers.{ids[0]}" for ids in stages[1:]],
        tokens_per_item=ctx.seq_len,
        position_buffers=("rope_cos", "rope_sin"),
        extra={"entropy": data.corpus.entropy()} if isinstance(data, SyntheticTokens) else {},
    )


def llama_workload(cfg: TrainerConfig) -> Workload:
    """The built-in workload of a job file's [model] and [data] (for benchmarks and tests)."""
    return llama(WorkloadContext.of(cfg))
