"""Job-file configuration for the trainer: the sections `model`, `parallel`, `train`,
`data`, `checkpoint` and `ft`.

A job file is TOML (or the JSON the daemon writes for its ranks). Values can be
overridden with ``--set section.key=value`` where the value is a TOML literal
(``3``, ``true``, ``"text"``, ``["a", "b"]``); a bare word is read as a string.

Every user mistake becomes a :class:`ConfigError` whose message is one sentence
naming the field and the fix. This module never imports torch, so bad input is
rejected in a fraction of a second and the daemon can validate job files with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Sections of a job file that belong to the daemon. The trainer skips them; the
# daemon validates them (daemon/config.py). Listed here by name only, so the
# trainer can read a full job file without importing the daemon.
DAEMON_SECTIONS: tuple[str, ...] = ("job", "etcd", "node", "lighthouse", "metrics")


class ConfigError(Exception):
    """A user-caused configuration problem; the message is one sentence with the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class ModelConfig(Section):
    """A Llama-style decoder. The defaults train 50 steps in seconds on 2 CPU cores."""

    vocab_size: int = Field(64, ge=2, description="Vocabulary size (256 for data.source = text).")
    dim: int = Field(64, ge=8, description="Model width.")
    n_layers: int = Field(2, ge=1, description="Number of transformer blocks.")
    n_heads: int = Field(4, ge=1, description="Attention heads.")
    n_kv_heads: int | None = Field(
        None, ge=1, description="Key/value heads for grouped-query attention (default n_heads)."
    )
    ffn_hidden: int | None = Field(
        None, ge=1, description="SwiGLU hidden width (default 8/3 * dim rounded up to multiple_of)."
    )
    multiple_of: int = Field(32, ge=1, description="Rounding for the default ffn_hidden.")
    norm_eps: float = Field(1e-5, gt=0, description="RMSNorm epsilon.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base frequency.")
    max_seq_len: int = Field(256, ge=2, description="Longest sequence RoPE is precomputed for.")
    tie_embeddings: bool = Field(False, description="Share the embedding and output weights.")
    init_std: float = Field(0.02, gt=0, description="Standard deviation of the weight init.")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        raw = int(8 * self.dim / 3)
        return self.multiple_of * ((raw + self.multiple_of - 1) // self.multiple_of)


PipelineSchedule = Literal["GPipe", "1F1B", "Interleaved1F1B"]


class ParallelConfig(Section):
    """Parallelism inside one replica group; replication across groups is torchft's."""

    dp_shard: int = Field(1, ge=1, description="FSDP2 sharding degree.")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree (with sequence-parallel norms).")
    pp: int = Field(1, ge=1, description="Pipeline-parallel degree.")
    pp_schedule: PipelineSchedule = Field("1F1B", description="GPipe, 1F1B or Interleaved1F1B.")
    pp_microbatches: int | None = Field(
        None, ge=1, description="Pipeline microbatches per step (default pp)."
    )
    pp_stages_per_rank: int | None = Field(
        None, ge=1, description="Stages each pp rank holds (default 2 for Interleaved1F1B, else 1)."
    )
    activation_checkpointing: Literal["none", "full"] = Field(
        "none", description="Recompute each block's activations in backward."
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Compute dtype of parameters (mixed precision)."
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of gradient reductions."
    )
    compile: bool = Field(False, description="torch.compile each block.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks cuda when available, else cpu."
    )

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        return self.pp_microbatches or self.pp

    @property
    def stages_per_rank(self) -> int:
        default = 2 if self.pp_schedule == "Interleaved1F1B" else 1
        return self.pp_stages_per_rank or default


class TrainConfig(Section):
    steps: int = Field(50, ge=1, description="Optimizer steps to train.")
    batch_size: int = Field(
        8,
        ge=1,
        description="Items (sequences) per micro-batch of one replica group, split across its "
        "dp_shard ranks; a group runs as many micro-batches as its share of the step needs.",
    )
    global_batch_size: int = Field(
        0,
        ge=0,
        description="Items per optimizer step across the whole job (0 = train.batch_size). The "
        "groups in each step's quorum split them; the items of step s are s*B .. s*B+B-1 "
        "whoever is alive.",
    )
    seq_len: int = Field(64, ge=2, description="Tokens per sequence.")
    grad_accum: int = Field(
        1, ge=1, description="Forward passes each micro-batch of train.batch_size is cut into."
    )
    seed: int = Field(0, ge=0, description="Seed of the weight init and the data order.")
    lr: float = Field(3e-3, gt=0, description="Peak learning rate (AdamW).")
    min_lr: float = Field(3e-4, ge=0, description="Learning rate at the end of the cosine decay.")
    warmup_steps: int = Field(5, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 = off).")
    max_skipped_steps: int = Field(
        10,
        ge=1,
        description="Steps in a row with a non-finite loss or gradient norm (each skipped on "
        "every group, never committed) before the job stops with an error.",
    )
    log_every: int = Field(1, ge=1, description="Emit a train_step event every N steps.")
    eval_every: int = Field(
        0,
        ge=0,
        description="Evaluate every N committed steps (0 = never): the mean loss over a fixed "
        "set of the workload's evaluation items, the same in every replica group.",
    )
    eval_batches: int = Field(
        4, ge=1, description="Batches of train.batch_size evaluation items per evaluation."
    )
    log_init_digest: bool = Field(
        False,
        description="Put the initial parameters' params_sha256 in the rank_started event "
        "(gathers every parameter once; for checking that layouts start equal).",
    )

    @property
    def global_batch(self) -> int:
        """Items per optimizer step across the job."""
        return self.global_batch_size or self.batch_size


class DataConfig(Section):
    source: Literal["synthetic", "text", "tokens"] = Field(
        "synthetic", description="synthetic bigram corpus, a UTF-8 text file, or a token file."
    )
    path: str | None = Field(None, description="File for text and tokens sources.")
    token_dtype: Literal["uint16", "int32", "uint32"] = Field(
        "uint16", description="Element type of a tokens file."
    )
    corpus_seed: int = Field(1234, ge=0, description="Seed of the synthetic bigram model.")
    successors: int = Field(
        4, ge=1, description="Likely successors per token in the synthetic corpus."
    )


class WorkloadConfig(Section):
    """What to train (docs/workloads.md); unset spec: the built-in Llama of [model] and [data]."""

    spec: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description='Entry point "module:function" returning a trainer.workload.Workload.',
    )
    python_path: list[str] = Field(
        default_factory=list,
        description="Directories put on the ranks' PYTHONPATH so that spec's module imports.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Free-form settings handed to the entry point."
    )


class CheckpointConfig(Section):
    dir: str | None = Field(
        None,
        description="Directory for DCP checkpoints (unset = off); a run keeps its own in "
        "<dir>/<job>/run-<id>, the id a hash of model, data, train.seed, the global batch and seq_len.",
    )
    interval_steps: int = Field(
        500,
        ge=0,
        description="Save every N steps (0 = only at the end and on a drain); a kill of every "
        "node loses at most the steps since the last save.",
    )
    keep: int = Field(3, ge=1, description="Complete checkpoints to keep.")
    resume_from: str | None = Field(
        None,
        description="Start from another run's checkpoint when this run has none of its own: "
        "a step-<N> directory, or a run directory (<dir>/<job>/run-<id>: its newest valid "
        "one). One saved for another model configuration exits 2.",
    )
    async_save: bool = Field(
        True, alias="async", description="Save with DCP async_save (false = synchronous)."
    )


class FaultToleranceConfig(Section):
    """torchft Manager settings; used only when TORCHFT_LIGHTHOUSE is set."""

    timeout_s: float = Field(30.0, gt=0, description="Collectives, should_commit and healing.")
    quorum_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Waiting for a quorum; a rank that waits longer exits 75 and its node waits "
        "for its peers (not a crash).",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Connecting to lighthouse/peers.")
    async_quorum: bool = Field(True, description="Compute the quorum during the forward pass.")
    digest_every: int = Field(
        100,
        ge=0,
        description="Compare the groups' parameters every N committed steps (0 = never); a "
        "minority group is restarted and healed. Costs one pass over the parameters on the "
        "device and one small all-reduce.",
    )
    quorum_retries: int = Field(
        30,
        ge=0,
        description="Lighthouse quorum retries (spread over quorum_timeout_s); they carry a group across a lighthouse failover.",
    )


class TrainerConfig(Section):
    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    workload: WorkloadConfig = WorkloadConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    ft: FaultToleranceConfig = FaultToleranceConfig()


# Sections whose values every node of a job must share (see `spec_hash`).
TRAINER_SECTIONS: tuple[str, ...] = tuple(TrainerConfig.model_fields)

C = TypeVar("C", bound=Section)


def add_override_option(parser: argparse.ArgumentParser) -> None:
    """The `--set section.key=value` option every Phalanx command shares."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a setting; the value is a TOML literal (bare words are strings)",
    )


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value`` and read the value as a TOML literal (bare words are strings)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"--set {text!r} is not of the form section.key=value; write for example --set train.steps=100."
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``section.key=value`` override applied."""
    result: dict[str, Any] = json.loads(json.dumps(data))
    for text in overrides:
        parts, value = parse_override(text)
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"--set {text!r} goes through {part!r}, which is a value and not a section."
                )
            node = child
        node[parts[-1]] = value
    return result


def read_job_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML job file (or the JSON the daemon writes) into a dict."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"job file {p} does not exist; pass an existing file to --config."
        ) from None
    except OSError as e:
        raise ConfigError(
            f"job file {p} cannot be read ({e.strerror}); check its permissions."
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"job file {p} is not UTF-8 text (byte {e.start} is invalid); save it as UTF-8."
        ) from None
    try:
        loaded = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"job file {p} is not valid {p.suffix.lstrip('.') or 'TOML'}: {e}."
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"job file {p} must hold a table of sections.")
    return loaded


def _describe(error: Mapping[str, Any], model: type[BaseModel], source: str) -> str:
    loc = [str(x) for x in error["loc"]]
    field = ".".join(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        if len(loc) == 1:
            known = ", ".join(sorted(model.model_fields))
            return f"{source}: [{field}] is not a known section; the sections are {known}."
        parent: Any = model
        for part in loc[:-1]:
            parent = parent.model_fields[part].annotation
        known = ", ".join(sorted(f.alias or name for name, f in parent.model_fields.items()))
        return f"{source}: {field} is not a known setting; [{'.'.join(loc[:-1])}] accepts {known}."
    got = error.get("input")
    message = str(error["msg"])
    message = message.removeprefix("Input ").removeprefix("Value error, ")
    message = message[0].lower() + message[1:]
    return f"{source}: {field} {message} (got {got!r}); fix it in the job file or with --set {field}=..."


def validate(model: type[C], data: Mapping[str, Any], source: str) -> C:
    """Validate ``data`` against ``model``, turning the first error into a ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e.errors()[0], model, source)) from None


def load_trainer_config(
    path: str | Path, overrides: Sequence[str] = (), world_size: int | None = None
) -> TrainerConfig:
    """Read, override, validate and cross-check a job file for the trainer."""
    data = apply_overrides(read_job_file(path), overrides)
    own = {k: v for k, v in data.items() if k not in DAEMON_SECTIONS}
    cfg = validate(TrainerConfig, own, str(path))
    from trainer.config_checks import check_trainer  # it imports this module

    try:
        check_trainer(cfg, world_size)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg


def spec_hash(data: Mapping[str, Any], sections: Iterable[str]) -> str:
    """SHA-256 of the given sections of a resolved config, independent of key order."""
    picked = {name: data.get(name) for name in sorted(sections)}
    blob = json.dumps(picked, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
