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

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

# Sections of a job file that belong to the daemon. The trainer skips them; the
# daemon validates them (daemon/config/sections.py). Listed here by name only, so the
# trainer can read a full job file without importing the daemon.
DAEMON_SECTIONS: tuple[str, ...] = (
    "job",
    "etcd",
    "node",
    "lighthouse",
    "hang",
    "metrics",
    "health",
)


class ConfigError(Exception):
    """A user-caused configuration problem; the message is one sentence with the fix."""


# Bounds that keep values inside what the consumers accept: a seed torch.manual_seed and
# numpy take as a signed 64-bit integer, and timeouts that fit a datetime.timedelta and
# torchft's millisecond fields (inf or 1e20 s overflow there, in the ranks).
MAX_SEED = 2**63 - 1
MAX_TIMEOUT_S = 86400.0  # one day


class Section(BaseModel):
    """A job-file section: unknown keys refused, no type coercion, every float finite
    (``inf`` and ``nan`` are refused for every float field of both configs)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=True, allow_inf_nan=False
    )


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
    cp: int = Field(
        1,
        ge=1,
        description="Context-parallel degree: each cp rank holds 2 of the 2*cp chunks of every "
        "sequence (load-balanced for causal attention); FSDP shards over dp_shard*cp.",
    )
    cp_attention: Literal["auto", "all_gather", "torch"] = Field(
        "auto",
        description="Attention across the cp ranks: all_gather (K and V gathered, any device), "
        "torch (torch's context_parallel, CUDA only); auto is torch on CUDA, else all_gather.",
    )
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
    fp8: bool = Field(
        False,
        description="FP8 training through torchao (pip install phalanx[fp8]): the Linear layers "
        "but the output layer compute in float8; needs a GPU of compute capability 8.9 or newer. "
        "Compiles the model as parallel.compile does (uncompiled, FP8 ran at half bf16's speed).",
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = Field(
        "tensorwise",
        description="torchao's float8 scaling recipe; tensorwise also all-gathers FSDP shards "
        "in float8.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks cuda when available, else cpu."
    )

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.cp * self.tp * self.pp

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
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seed of the weight init and the data order (0 to 2**63-1).",
    )
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
    corpus_seed: int = Field(
        1234, ge=0, le=MAX_SEED, description="Seed of the synthetic bigram model (0 to 2**63-1)."
    )
    successors: int = Field(
        4, ge=1, description="Likely successors per token in the synthetic corpus."
    )


class WorkloadConfig(Section):
    """What to train (docs/workloads.md); unset spec: the built-in Llama of [model] and [data]."""

    spec: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description='Entry point "module:function" returning a trainer.workloads.Workload.',
    )
    python_path: list[str] = Field(
        default_factory=list,
        description="Directories put on the ranks' PYTHONPATH so that spec's module imports; "
        "a relative one in a job file is beside that file (in --set, the current directory).",
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
        "one). It must exist when the daemon starts; one saved for another model configuration "
        "exits 2.",
    )
    async_save: bool = Field(
        True, alias="async", description="Save with DCP async_save (false = synchronous)."
    )


class FaultToleranceConfig(Section):
    """torchft Manager settings; used only when TORCHFT_LIGHTHOUSE is set."""

    timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Collectives, should_commit and healing (at most 86400 s).",
    )
    quorum_timeout_s: float = Field(
        60.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Waiting for a quorum (at most 86400 s); a rank that waits longer exits 75 "
        "and its node waits for its peers (not a crash).",
    )
    connect_timeout_s: float = Field(
        10.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Connecting to lighthouse/peers (at most 86400 s).",
    )
    async_quorum: bool = Field(
        True,
        description="Compute the quorum during the forward pass (every-step mode; diloco asks "
        "for it at each sync, synchronously).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto",
        description="The collectives across groups: auto is nccl on CUDA, else gloo; gloo on "
        "CUDA lets groups share a GPU (NCCL refuses two ranks on one device), as the demo does.",
    )
    straggler_factor: float = Field(
        1.5,
        ge=0,
        le=1000,
        description="A rank whose compute takes this many times the other groups' mean "
        "(the median over straggler_steps steps) is named a straggler; 0 turns it off.",
    )
    straggler_steps: int = Field(
        20, ge=1, le=100_000, description="Steps the straggler check takes the median over."
    )
    digest_every: int = Field(
        100,
        ge=0,
        description="Compare the groups' parameters every N committed steps (0 = never); a "
        "minority group is restarted and healed. Costs one pass over the parameters on the "
        "device and one small all-reduce.",
    )
    quorum_retries: int = Field(
        600,
        ge=0,
        le=1_000_000,
        description="Lighthouse quorum retries; torchft waits quorum_timeout_s / (quorum_retries + 1), "
        "at least 0.1 s, after a failed call: the default asks again 0.1 s after a leader change.",
    )
    semi_sync_method: Literal["none", "diloco"] = Field(
        "none",
        description="How the groups exchange: none averages every step's gradients across "
        "groups; diloco lets each group take sync_steps steps on its own, then averages how "
        "far each moved and takes one outer step (for slow links between groups).",
    )
    sync_steps: int = Field(
        20,
        ge=1,
        le=100_000,
        description="diloco: inner steps per round between syncs (train.steps, "
        "checkpoint.interval_steps, train.eval_every and ft.digest_every are multiples of it).",
    )
    outer_lr: float = Field(
        0.7, gt=0, le=10, description="diloco: the outer SGD's learning rate (the DiLoCo paper's)."
    )
    outer_momentum: float = Field(
        0.9, ge=0, lt=1, description="diloco: the outer SGD's Nesterov momentum (0: plain SGD)."
    )
    sync_bf16: bool = Field(
        False,
        description="diloco: send the pseudo-gradients across groups as bfloat16 (half the "
        "bytes of float32 parameters, averaged in bfloat16; every group applies the same "
        "average, so the groups stay bitwise alike).",
    )
    num_fragments: int = Field(
        1,
        ge=1,
        le=1024,
        description="diloco: streaming DiLoCo. The parameters are cut into this many "
        "fragments (in model order, nearly equal in size); a sync every sync_steps / "
        "num_fragments steps exchanges one of them in turn, so each fragment still syncs "
        "every sync_steps steps while the link carries a fragment at a time. The job's last "
        "sync exchanges every fragment. torchtitan's name; sync_steps must be a multiple.",
    )
    should_quantize: bool = Field(
        False,
        description="diloco: send the pseudo-gradients across groups as int8 (a quarter of "
        "the bytes of float32; rounded to 127 // job.max_replicas steps of a scale per row "
        "shared by the groups, summed exactly, so the groups stay bitwise alike). torchtitan's "
        "name; not with ft.sync_bf16.",
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
