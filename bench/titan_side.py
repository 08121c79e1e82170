"""torchtitan's own trainer on the shape Phalanx's trainer is measured at (issue 53).

`make gpu-check`'s ``titan`` row runs this beside the built-in 937M Llama (dim 2048,
16 layers, 16 heads, vocab 32,000, seq 2,048, batch 8, bf16 autocast, compiled, one
rank) and reports tokens/s and peak memory of both, as a ratio. Here torchtitan builds
its Llama 3 (``torchtitan.models.llama3``) at that shape with the SwiGLU width Phalanx's
model has (8/3 dim, rounded up to 32), its default FlexAttention and no activation
checkpointing,
and runs its ``Trainer.train_step`` on synthetic tokens: nothing is downloaded, no
tokenizer is read.

Two torchtitan modules a dense Llama run never calls cannot be imported everywhere: the
expert-parallel kernels need triton (absent from CPU builds of torch) and the Hugging
Face text datasets need ``datasets``. Where one fails to import, a stand-in that raises
if anything of it is used takes its place (:func:`stand_in_for_unused_modules`).

    python -m bench.titan_side --shape 937m --steps 40 --compile --json OUT
    python -m bench.titan_side --shape tiny --steps 4            # a CPU check of the path

torchtitan is not a dependency of Phalanx's package: ``make venv`` installs it from
bench/titan-requirements.txt, without its data and logging requirements.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

TITAN_VERSION = "0.3.0"  # the release this module was written against
SKIP_STEPS = 10  # as bench/gpu_check.py: allocation and compile are left out
UNUSED = (
    "torchtitan.distributed.minimal_async_ep.kernels",  # triton kernels for MoE
    "torchtitan.hf_datasets.text_datasets",  # Hugging Face datasets
)


@dataclass(frozen=True)
class Shape:
    dim: int
    n_layers: int
    n_heads: int
    vocab: int
    seq: int
    batch: int

    @property
    def hidden(self) -> int:
        """The SwiGLU width Phalanx's model has at this shape (its default multiple_of)."""
        from trainer.config.sections import ModelConfig

        return ModelConfig(dim=self.dim, n_heads=self.n_heads).hidden


SHAPES = {
    "937m": Shape(dim=2048, n_layers=16, n_heads=16, vocab=32000, seq=2048, batch=8),
    "tiny": Shape(dim=64, n_layers=2, n_heads=4, vocab=256, seq=64, batch=2),
}


class _Unused(types.ModuleType):
    """A module this run imports but never calls: any name of it is a class whose use
    raises, so a subclass or an annotation still imports; its ``Config`` takes any
    fields (a default of a config this run does not use is still built)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        module, why = self.__name__, self.why

        class Absent:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                raise RuntimeError(f"{module}.{name} is not available here ({why})")

            class Config:
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    self.fields = kwargs

        return Absent

    why = ""


def stand_in_for_unused_modules() -> list[str]:
    """Import each of UNUSED; the ones that fail get a stand-in. Returns their names."""
    stood_in = []
    for name in UNUSED:
        try:
            importlib.import_module(name)
        except ImportError as e:
            stub = _Unused(name)
            stub.why = f"{type(e).__name__}: {e}"
            sys.modules[name] = stub
            stood_in.append(name)
    return stood_in


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class _CpuAsDevice(types.ModuleType):
    """``torch.cpu`` with what torchtitan asks of a device module (its memory monitor's
    name, index, capacity and peak statistics), for a check of this path on a CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_properties(device: Any = None) -> Any:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return types.SimpleNamespace(total_memory=pages)

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        return {}

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass


def _torchtitan_on(device: str) -> None:
    """torchtitan picks CUDA when it finds no accelerator; on a CPU it is told so, before
    its other modules import its choice."""
    from torchtitan.tools import utils

    if device == "cpu":
        utils.device_type, utils.device_module = "cpu", _CpuAsDevice("torch.cpu")


def model_spec(shape: Shape, attention: str) -> Any:
    """torchtitan's Llama 3 at `shape`, built with its own initialisers. `attention`:
    "flex", torchtitan's default for its language models (block-causal masks from the
    tokens' positions), or "sdpa" (plain causal), where FlexAttention has no backward
    (a CPU)."""
    from torchtitan.models import llama3
    from torchtitan.models.common import (
        ComplexRoPE,
        Embedding,
        Linear,
        RMSNorm,
    )
    from torchtitan.models.common.attention import (
        ScaledDotProductAttention,
    )

    dim = shape.dim
    config = llama3.Llama3Model.Config(
        dim=dim,
        vocab_size=shape.vocab,
        tok_embeddings=Embedding.Config(
            num_embeddings=shape.vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=shape.vocab, param_init=llama3._output_linear_init(dim)
        ),
        layers=llama3._build_llama3_layers(
            n_layers=shape.n_layers,
            dim=dim,
            n_heads=shape.n_heads,
            hidden_dim=shape.hidden,
            rope=ComplexRoPE.Config(
                dim=dim // shape.n_heads, max_seq_len=shape.seq, theta=10000.0, scaling="none"
            ),
            attn_backend="flex",
        ),
    )
    if attention == "sdpa":
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    spec = llama3.model_registry("debugmodel")
    spec.model, spec.flavor = config, "phalanx-shape"
    return spec


def _data_and_tokenizer(shape: Shape, positions: bool) -> tuple[Any, Any]:
    """A data loader of synthetic tokens and a tokenizer that only knows its vocabulary,
    as torchtitan components (their Config builds them)."""
    from dataclasses import dataclass as titan_dataclass

    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class SyntheticTokens(BaseDataLoader):  # type: ignore[misc]
        @titan_dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):  # type: ignore[misc]
            vocab: int = 0
            positions: bool = True

        def __init__(self, config: Any, **kwargs: Any) -> None:
            self.vocab, self.seq = config.vocab, int(kwargs["seq_len"])
            self.positions = config.positions
            self.batch = int(kwargs["local_batch_size"])
            self.generator = torch.Generator().manual_seed(0)

        def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
            while True:
                size = (self.batch, self.seq + 1)
                tokens = torch.randint(0, self.vocab, size, generator=self.generator)
                batch = {"input": tokens[:, :-1]}
                if self.positions:  # one document per row: FlexAttention's mask is causal
                    batch["positions"] = torch.arange(self.seq).repeat(self.batch, 1)
                yield batch, tokens[:, 1:]

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    class VocabOnly(BaseTokenizer):  # type: ignore[misc]
        @titan_dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):  # type: ignore[misc]
            vocab: int = 0

        def __init__(self, config: Any, **kwargs: Any) -> None:
            super().__init__()
            self.vocab = config.vocab

        def encode(self, *args: Any, **kwargs: Any) -> list[int]:
            raise RuntimeError("synthetic tokens: nothing to encode")

        def decode(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("synthetic tokens: nothing to decode")

        def get_vocab_size(self) -> int:
            return int(self.vocab)

    data = SyntheticTokens.Config(vocab=shape.vocab, positions=positions)
    return data, VocabOnly.Config(vocab=shape.vocab)


def trainer_config(shape: Shape, steps: int, compile: bool, attention: str, dump: Path) -> Any:
    """torchtitan's Trainer.Config for one rank: bf16 autocast (torchtitan's mixed precision
    without FSDP), AdamW, no checkpoint, no validation, no activation checkpointing."""
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.components.validate import Validator
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.trainer import Trainer

    data, tokenizer = _data_and_tokenizer(shape, positions=attention == "flex")
    return Trainer.Config(
        model_spec=model_spec(shape, attention),
        loss=CrossEntropyLoss.Config(global_vocab_size=shape.vocab),
        tokenizer=tokenizer,
        dataloader=data,
        optimizer=default_adamw(lr=3e-4),
        training=TrainingConfig(
            local_batch_size=shape.batch,
            seq_len=shape.seq,
            steps=steps,
            mixed_precision_param="bfloat16",
        ),
        metrics=MetricsProcessor.Config(log_freq=10**9),
        activation_checkpoint=None,
        compile=CompileConfig(enable=compile),
        validator=Validator.Config(enable=False),
        dump_folder=str(dump),
    )


def _one_rank_env() -> None:
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(29500 + os.getpid() % 1000)),
    ):
        os.environ.setdefault(name, value)


def _peak_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # the process's


def run(shape: Shape, steps: int, compile: bool, attention: str, dump: Path) -> dict[str, Any]:
    """Build torchtitan's trainer and time `steps` of its train_step; tokens/s of the
    median step after the first SKIP_STEPS (of all of them when there are no more)."""
    device = _device()
    _torchtitan_on(device)  # first: torchtitan's modules read the device as they import
    stood_in = stand_in_for_unused_modules()
    _one_rank_env()
    import torchtitan

    config = trainer_config(shape, steps, compile, attention, dump)
    trainer = config.build()
    times: list[float] = []
    try:
        batches = trainer.batch_generator(trainer.dataloader)
        for _ in range(steps):
            began = time.perf_counter()
            trainer.step += 1
            trainer.train_step(batches)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    timed = times[SKIP_STEPS:] or times
    tokens = shape.batch * shape.seq  # per step; the median step, as gpu_check's rates
    return {
        "torchtitan": getattr(torchtitan, "__version__", "unknown"),
        "device": device,
        "shape": asdict(shape),
        "compile": compile,
        "attention": attention,
        "steps": steps,
        "timed_steps": len(timed),
        "tokens_per_s": tokens / statistics.median(timed),
        "peak_bytes": _peak_bytes(device),
        "step_s": [round(t, 4) for t in times],
        "stood_in": stood_in,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="937m")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--attention",
        choices=("flex", "sdpa"),
        default=None,
        help="flex (torchtitan's default) where a GPU is, sdpa on a CPU",
    )
    parser.add_argument("--dump", type=Path, default=Path("/tmp/phalanx-titan"))
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    if args.steps < 1:
        print("error: --steps must be at least 1.", file=sys.stderr)
        return 2
    attention = args.attention or ("flex" if torch.cuda.is_available() else "sdpa")
    result = run(SHAPES[args.shape], args.steps, args.compile, attention, args.dump)
    text = json.dumps(result)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
