"""A Hugging Face causal LM under Phalanx: transformers' Llama decoder layers built from a
``LlamaConfig`` (no weights, no tokenizer, nothing downloaded), trained on the bytes of
a local text file (vocabulary 256).

The layers are held in an ``nn.ModuleDict`` trunk with the embedding before it and the
final norm and head after it, so Phalanx can cut the model into pipeline stages; the
rotary tables are computed from buffers of the root, which every stage keeps. Positions
come from a buffer too (``positions``, named in ``position_buffers``), so with context
parallel (``parallel.cp``) each rank rotates its own positions' queries and keys.

    [workload]
    spec = "hf_workload:spec"
    python_path = ["."]  # beside the job file
    [workload.options]
    text = "README.md"        # any local UTF-8 file
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from trainer.data.sources import TokenWindows, WindowTokens
from trainer.workloads import InitFn, Workload, WorkloadContext

OPTIONS = {"text": "README.md", "hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2}


class HFCausalLM(nn.Module):
    """Embedding -> LlamaDecoderLayer x N -> norm -> head; parts a stage lacks are None."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens: nn.Embedding | None = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleDict(
            {
                str(i): LlamaDecoderLayer(config, layer_idx=i)
                for i in range(config.num_hidden_layers)
            }
        )
        self.norm: LlamaRMSNorm | None = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head: nn.Linear | None = nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        inv_freq, self.rope_scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        self.register_buffer("positions", positions, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions: torch.Tensor = self.positions[: h.shape[1]]  # type: ignore[index]  # a buffer
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]  # a registered buffer
        freqs = torch.outer(positions, inv_freq.float())
        angles = torch.cat((freqs, freqs), dim=-1)[None]
        cos = (angles.cos() * self.rope_scaling).to(h.dtype)
        sin = (angles.sin() * self.rope_scaling).to(h.dtype)
        for layer in self.layers.values():
            h = layer(h, position_embeddings=(cos, sin))  # no mask: SDPA's causal attention
        if self.norm is not None:
            h = self.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def llama_config(o: dict[str, object], seq_len: int) -> LlamaConfig:
    hidden, heads = int(str(o["hidden"])), int(str(o["heads"]))
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=int(str(o["layers"])),
        num_attention_heads=heads,
        num_key_value_heads=int(str(o["kv_heads"])),
        max_position_embeddings=seq_len,
        initializer_range=0.02,
    )
    config._attn_implementation = "sdpa"  # causal without a mask
    return config


def initializer(config: LlamaConfig) -> InitFn:
    """HF's Llama init by name: normal(0, initializer_range) weights, norms 1, rope from config."""
    inv_freq, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)

    def init(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if name == "inv_freq":
            return inv_freq
        if name == "positions":
            return torch.arange(like.shape[0], dtype=like.dtype)
        if "norm" in name:
            return torch.ones(like.shape)
        return torch.randn(like.shape, generator=gen) * config.initializer_range

    return init


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def spec(ctx: WorkloadContext) -> Workload:
    unknown = set(ctx.options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown workload.options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    o = {**OPTIONS, **ctx.options}
    config = llama_config(o, ctx.seq_len)
    text = Path(str(o["text"]))
    windows = TokenWindows(np.fromfile(text, dtype=np.uint8), ctx.seq_len + 1, str(text))
    return Workload(
        name="hf-llama",
        build_model=lambda: HFCausalLM(config),
        init=initializer(config),
        loss=cross_entropy,
        train_data=WindowTokens(windows, ctx.seed),
        eval_data=WindowTokens(windows, ctx.seed + 1_000_003),
        shard_units=LlamaDecoderLayer,
        trunk="layers",
        tokens_per_item=ctx.seq_len,
        position_buffers=("positions",),
        extra={"uniform_loss": math.log(256)},
    )
