"""FP8 training through torchao's float8 Linear, applied to the (meta) model first, before
tensor parallel and FSDP (parallelize.py): each eligible ``nn.Linear`` becomes a
``Float8Linear`` that casts its inputs, weights and gradients to float8 for the matmuls.

Left in high precision: the output layer (``output``, ``lm_head``: its logits feed the
loss and are the layer most sensitive to the cast) and any Linear whose dimensions are
not multiples of 16 (float8 matmuls need them). With the tensorwise recipe and FSDP,
shards are all-gathered in float8 too (half the bytes of bf16).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.config import ConfigError, ParallelConfig

KEPT = ("output", "lm_head")  # module names never converted
# Why parallel.fp8 turns parallel.compile on (parallelize.py), said once as fp8_compiles.
FP8_COMPILES = (
    "parallel.fp8 = true compiles the model as parallel.compile = true does: uncompiled, its "
    "float8 casts run as separate kernels, and the 937M model trained at 0.48x the speed of "
    "bf16 on an H100 (with compile, 1.15x of compiled bf16 on an H200)"
)
MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with float8 tensor cores


def check_device(device: torch.device) -> None:
    """Refuse a device without float8 matmuls (one sentence, exit 2)."""
    if device.type != "cuda":
        raise ConfigError(
            f"parallel.fp8 = true needs a GPU with FP8 support (compute capability 8.9 or newer), "
            f"but the ranks train on {device.type}; set parallel.fp8 = false."
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"parallel.fp8 = true needs compute capability 8.9 or newer, but {name} has "
            f"{major}.{minor}; set parallel.fp8 = false."
        )


def eligible(module: nn.Module, fqn: str) -> bool:
    """Whether the Linear at `fqn` trains in float8."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in KEPT:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_fp8(model: nn.Module, cfg: ParallelConfig, sharded: bool) -> list[str]:
    """Convert `model`'s eligible Linears in place; returns their names. `sharded`: FSDP
    will shard the model (tensorwise then all-gathers in float8)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ConfigError(
            f"parallel.fp8 = true needs torchao ({e}); pip install 'phalanx[fp8]' or set "
            "parallel.fp8 = false."
        ) from None
    config: Any = Float8LinearConfig.from_recipe_name(cfg.fp8_recipe)
    if cfg.fp8_recipe == "tensorwise" and sharded:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    converted = [fqn for fqn, m in model.named_modules() if eligible(m, fqn)]
    convert_to_float8_training(model, config=config, module_filter_fn=eligible)
    return converted
