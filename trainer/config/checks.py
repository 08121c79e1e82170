"""Cross-field checks of a trainer configuration that per-field validation cannot express.

Like trainer/config/sections.py, this never imports torch: the daemon runs these checks too.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Callable
from pathlib import Path

from trainer.config.sections import ConfigError, DataConfig, TrainerConfig

TOKEN_BYTES = {"uint16": 2, "int32": 4, "uint32": 4}


def check_trainer(cfg: TrainerConfig, world_size: int | None = None) -> None:
    """Cross-field checks that pydantic's per-field validation cannot express."""
    p, t = cfg.parallel, cfg.train

    def fail(msg: str) -> None:
        raise ConfigError(msg)

    if world_size is not None and p.world_size != world_size:
        fail(
            f"parallel.dp_shard*cp*tp*pp is {p.dp_shard}*{p.cp}*{p.tp}*{p.pp} = {p.world_size}, "
            f"but the replica group has {world_size} ranks; make the product equal the group's "
            "world size."
        )
    if t.min_lr > t.lr:
        fail(f"train.min_lr ({t.min_lr}) must not exceed train.lr ({t.lr}).")
    per_step = p.dp_shard * t.grad_accum * (p.microbatches if p.pp > 1 else 1)
    if t.batch_size % per_step:
        what = "parallel.dp_shard*train.grad_accum" + (
            "*parallel.pp_microbatches" if p.pp > 1 else ""
        )
        fail(f"train.batch_size ({t.batch_size}) must be divisible by {what} ({per_step}).")
    if p.pp > 1 and t.global_batch_size % (t.batch_size // p.dp_shard):
        fail(
            f"train.global_batch_size ({t.global_batch_size}) must be a multiple of "
            f"train.batch_size/parallel.dp_shard ({t.batch_size // p.dp_shard}) when parallel.pp > 1 "
            "(the schedule runs whole batches)."
        )
    if p.pp > 1:
        if t.grad_accum > 1:
            fail(
                "train.grad_accum must be 1 when parallel.pp > 1; raise parallel.pp_microbatches instead."
            )
        if p.pp_schedule == "Interleaved1F1B" and p.stages_per_rank < 2:
            fail("parallel.pp_stages_per_rank must be at least 2 for the Interleaved1F1B schedule.")
        if p.pp_schedule != "Interleaved1F1B" and p.stages_per_rank != 1:
            fail(f"parallel.pp_stages_per_rank must be 1 for the {p.pp_schedule} schedule.")
        if p.microbatches < p.pp:
            fail(
                f"parallel.pp_microbatches ({p.microbatches}) must be at least parallel.pp ({p.pp})."
            )
    if p.cp > 1:
        _check_cp(cfg, fail)
    if p.fp8 and p.tp > 1:
        fail(
            "parallel.fp8 with parallel.tp > 1 is not supported (float8 tensor-parallel plans are "
            "not built); set parallel.tp = 1 or parallel.fp8 = false."
        )
    if cfg.ft.semi_sync_method == "diloco":
        _check_rounds(cfg, fail)
    if cfg.workload.spec is None:
        _check_builtin(cfg, fail)
    else:
        check_workload_findable(cfg)


def _check_cp(cfg: TrainerConfig, fail: Callable[[str], None]) -> None:
    p, t = cfg.parallel, cfg.train
    if t.seq_len % (2 * p.cp):
        fail(
            f"train.seq_len ({t.seq_len}) must be divisible by 2*parallel.cp ({2 * p.cp}): each "
            "cp rank holds two of the 2*cp equal chunks of every sequence."
        )
    if p.pp > 1:
        fail(
            "parallel.cp > 1 with parallel.pp > 1 is not supported (context parallel inside "
            "pipeline stages is not built); set parallel.pp = 1 or parallel.cp = 1."
        )
    if p.cp_attention == "torch" and p.device == "cpu":
        fail(
            "parallel.cp_attention = 'torch' runs only on CUDA (torch's context_parallel), but "
            "parallel.device is 'cpu'; set parallel.cp_attention = 'all_gather'."
        )


def _check_rounds(cfg: TrainerConfig, fail: Callable[[str], None]) -> None:
    """DiLoCo commits whole rounds (with fragments, a sync's share of one): what happens
    at a step happens at a sync."""
    ft = cfg.ft
    if ft.sync_steps % ft.num_fragments:
        fail(
            f"ft.sync_steps ({ft.sync_steps}) must be a multiple of ft.num_fragments "
            f"({ft.num_fragments}): each fragment syncs every ft.sync_steps steps, one every "
            "ft.sync_steps / ft.num_fragments; change one."
        )
        return
    every = ft.sync_steps // ft.num_fragments
    for name, value in (
        ("train.steps", cfg.train.steps),
        ("checkpoint.interval_steps", cfg.checkpoint.interval_steps),
        ("train.eval_every", cfg.train.eval_every),
        ("ft.digest_every", cfg.ft.digest_every),
    ):
        if value % every:
            fail(
                f"{name} ({value}) must be a multiple of {_sync_every(ft.num_fragments)} "
                f"({every}) with ft.semi_sync_method = 'diloco' (steps commit a sync at a "
                "time); change one."
            )
    if cfg.ft.should_quantize and cfg.ft.sync_bf16:
        fail(
            "ft.should_quantize (int8) and ft.sync_bf16 (bfloat16) both choose how the "
            "pseudo-gradients cross; set one of them to false."
        )
    if cfg.parallel.pp > 1 or cfg.parallel.cp > 1:
        fail(
            "ft.semi_sync_method = 'diloco' runs with parallel.pp = 1 and parallel.cp = 1 (its "
            "rounds are not built for pipeline or context parallel yet); set them to 1 or "
            "ft.semi_sync_method = 'none'."
        )


def _sync_every(fragments: int) -> str:
    return "ft.sync_steps" if fragments == 1 else "ft.sync_steps / ft.num_fragments"


def check_workload_findable(cfg: TrainerConfig) -> None:
    """Without importing anything: workload.python_path entries are directories and the
    top-level package of workload.spec is on them or on sys.path (the ranks import it)."""
    spec = cfg.workload.spec
    assert spec is not None
    for entry in cfg.workload.python_path:
        if not Path(entry).is_dir():
            raise ConfigError(
                f"workload.python_path entry {entry!r} is not a directory; point it at the "
                "directory that holds the workload's package."
            )
    top = spec.partition(":")[0].split(".")[0]
    search = [*cfg.workload.python_path, os.getcwd(), *sys.path]
    if importlib.machinery.PathFinder.find_spec(top, search) is None:
        raise ConfigError(
            f"workload.spec {spec!r}: no module {top!r} on workload.python_path or the "
            "interpreter's path; add its directory to workload.python_path."
        )


def _check_builtin(cfg: TrainerConfig, fail: Callable[[str], None]) -> None:
    """[model] and [data] belong to the built-in Llama workload; checked only when it runs."""
    m, p, t, d = cfg.model, cfg.parallel, cfg.train, cfg.data
    if m.dim % m.n_heads:
        fail(f"model.dim ({m.dim}) must be divisible by model.n_heads ({m.n_heads}).")
    if m.n_heads % m.kv_heads:
        fail(f"model.n_heads ({m.n_heads}) must be divisible by model.n_kv_heads ({m.kv_heads}).")
    if (m.dim // m.n_heads) % 2:
        fail(f"model.dim / model.n_heads ({m.dim // m.n_heads}) must be even for RoPE.")
    if t.seq_len > m.max_seq_len:
        fail(
            f"train.seq_len ({t.seq_len}) exceeds model.max_seq_len ({m.max_seq_len}); raise model.max_seq_len."
        )
    if p.tp > 1:
        for name, value in (
            ("model.n_heads", m.n_heads),
            ("model.n_kv_heads", m.kv_heads),
            ("model.ffn_hidden", m.hidden),
            ("model.vocab_size", m.vocab_size),
            ("train.seq_len", t.seq_len),
        ):
            if value % p.tp:
                fail(f"{name} ({value}) must be divisible by parallel.tp ({p.tp}).")
    if m.tie_embeddings and (p.tp > 1 or p.pp > 1):
        fail(
            "model.tie_embeddings needs parallel.tp = 1 and parallel.pp = 1; untie it or drop tp/pp."
        )
    stages = p.pp * p.stages_per_rank
    if p.pp > 1 and m.n_layers < stages:
        fail(
            f"model.n_layers ({m.n_layers}) must be at least the number of pipeline stages ({stages})."
        )
    if d.source == "text" and m.vocab_size < 256:
        fail(
            f"model.vocab_size ({m.vocab_size}) must be at least 256 for data.source = text (byte tokens)."
        )
    if d.source == "synthetic" and d.successors > m.vocab_size:
        fail(f"data.successors ({d.successors}) must not exceed model.vocab_size ({m.vocab_size}).")
    if d.source in ("text", "tokens"):
        if not d.path:
            fail(
                f"data.path is required for data.source = {d.source}; set it to the {d.source} file."
            )
        elif not Path(d.path).is_file():
            fail(f"data.path {d.path} does not exist; point it at a {d.source} file.")


def check_data_contents(data: DataConfig, vocab: int, seq_len: int) -> None:
    """What a text or tokens file holds must make at least one window of ``seq_len + 1``
    tokens (input and target), whole tokens, every id below ``vocab``.

    Run by the daemon before it starts anything and by the ranks as they read the file
    (trainer/data/sources.py); a tokens file is scanned once (numpy, memory-mapped).
    """
    if data.source not in ("text", "tokens") or not data.path:
        return
    path = Path(data.path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ConfigError(
            f"data.path {path} cannot be read ({e.strerror}); point it at a {data.source} file."
        ) from None
    itemsize = 1 if data.source == "text" else TOKEN_BYTES[data.token_dtype]
    if size % itemsize:
        raise ConfigError(
            f"data.path {path} is not a whole number of {data.token_dtype} tokens; "
            "check data.token_dtype."
        )
    count, need = size // itemsize, seq_len + 2
    if count < need:
        raise ConfigError(
            f"data.path {path} holds {count} tokens, fewer than train.seq_len + 2 ({need}) "
            "for one input and target window; use a longer file or a shorter train.seq_len."
        )
    if data.source == "tokens":
        import numpy as np  # only here: the daemon imports this module at start

        try:
            top = int(np.memmap(path, dtype=data.token_dtype, mode="r").max())
        except OSError as e:
            raise ConfigError(
                f"data.path {path} cannot be read ({e.strerror}); make it readable."
            ) from None
        if top >= vocab:
            raise ConfigError(
                f"data.path {path} holds token id {top}, but model.vocab_size is {vocab}; "
                "raise model.vocab_size or fix data.token_dtype."
            )
