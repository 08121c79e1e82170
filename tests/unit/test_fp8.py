"""parallel.fp8 (issue 39, its CPU-runnable part): the float8 conversion on the meta device,
and the refusals of a device or layout that cannot train in float8."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from daemon.config import DaemonConfig
from daemon.config.preflight import check_fp8
from trainer import workloads
from trainer.config import ConfigError, TrainerConfig, validate
from trainer.config.checks import check_trainer
from trainer.parallel.fp8 import FP8_COMPILES, apply_fp8, check_device, eligible
from trainer.parallel.parallelize import compiles


def _llama(**model: object) -> tuple[TrainerConfig, nn.Module]:
    cfg = validate(
        TrainerConfig, {"model": {"vocab_size": 96, **model}, "parallel": {"fp8": True}}, "job"
    )
    return cfg, workloads.build_meta(workloads.load(cfg), "the built-in model")


def test_every_block_linear_becomes_float8_and_the_output_layer_does_not() -> None:
    cfg, model = _llama()
    converted = apply_fp8(model, cfg.parallel, sharded=False)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    fp8 = sorted(n for n, m in linears.items() if isinstance(m, Float8Linear))
    assert fp8 == sorted(converted) and fp8
    assert {n.rsplit(".", 1)[-1] for n in fp8} == {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
    assert not isinstance(model.get_submodule("output"), Float8Linear)
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing allocated


def test_a_linear_whose_sizes_are_not_multiples_of_16_stays_high_precision() -> None:
    assert eligible(nn.Linear(64, 48), "layers.0.w1")
    assert not eligible(nn.Linear(64, 40), "layers.0.w1")
    assert not eligible(nn.Linear(64, 64), "lm_head")
    assert not eligible(nn.Embedding(10, 16), "tok_embeddings")


def test_the_cpu_is_refused_in_one_sentence_naming_the_field() -> None:
    with pytest.raises(ConfigError) as e:
        check_device(torch.device("cpu"))
    assert "parallel.fp8" in str(e.value) and str(e.value).count(". ") == 0
    cfg = validate(DaemonConfig, {"parallel": {"fp8": True}, "node": {"device": "cpu"}}, "job")
    with pytest.raises(ConfigError, match=r"parallel\.fp8 = true needs a GPU .* on the cpu"):
        check_fp8(cfg)


def test_fp8_with_tensor_parallel_is_refused() -> None:
    cfg = validate(TrainerConfig, {"parallel": {"fp8": True, "tp": 2}}, "job")
    with pytest.raises(ConfigError, match=r"parallel\.fp8 with parallel\.tp > 1"):
        check_trainer(cfg)


def test_fp8_compiles_the_model_whatever_parallel_compile_says() -> None:
    """Uncompiled FP8 ran at 0.48x of bf16 on an H100 (docs/benchmarks.md): it compiles."""
    plain = validate(TrainerConfig, {}, "job").parallel
    fp8 = validate(TrainerConfig, {"parallel": {"fp8": True}}, "job").parallel
    both = validate(TrainerConfig, {"parallel": {"fp8": True, "compile": True}}, "job").parallel
    assert (compiles(plain), compiles(fp8), compiles(both)) == (False, True, True)
    assert "parallel.compile" in FP8_COMPILES and "0.48x" in FP8_COMPILES
