"""The job file's sections on what the daemon watches for: when a silent rank counts as
hung (``[hang]``) and when the node counts as healthy (``[health]``). Both are per node."""

from __future__ import annotations

from pydantic import Field

from trainer.config import Section

# The longest wait any setting may ask for: torchft's lighthouse takes its timeouts in
# milliseconds and Python's timers overflow long before 1e20 s.
MAX_WAIT_S = 86400.0  # one day


class HangConfig(Section):
    """Hang timeouts per phase of a rank's life (docs/failure-modes.md, "Hang timeouts").

    Each rank reports the phase it enters in its heartbeat. Steady steps get a timeout
    learned from the steps seen; the other phases get these settings, each defaulting to
    ``node.hang_timeout_s``."""

    start_s: float | None = Field(
        None, ge=5, le=MAX_WAIT_S, description="Start-up: from the spawn to the first step."
    )
    load_s: float | None = Field(None, ge=5, le=MAX_WAIT_S, description="Loading a checkpoint.")
    save_s: float | None = Field(
        None,
        ge=5,
        le=MAX_WAIT_S,
        description="A checkpoint save's blocking part (and the final save).",
    )
    eval_s: float | None = Field(None, ge=5, le=MAX_WAIT_S, description="An evaluation pass.")
    heal_s: float | None = Field(
        None, ge=5, le=MAX_WAIT_S, description="Sending or loading a peer's state (a heal)."
    )
    step_quantile: float = Field(
        0.99, gt=0, le=1, description="Learned step timeout: this quantile of the step times..."
    )
    step_factor: float = Field(
        4.0, ge=1, le=1000, description="... times this factor, within the floor and the ceiling."
    )
    step_samples: int = Field(
        30,
        ge=1,
        le=100_000,
        description="Steps seen before the learned timeout applies (the ceiling until then).",
    )
    step_min_s: float = Field(
        5.0,
        ge=1,
        le=MAX_WAIT_S,
        description="Floor of the learned step timeout; the floor is at least ft.timeout_s + "
        "margin_s, the longest a healthy rank waits for a dead peer's collective.",
    )
    margin_s: float = Field(
        5.0,
        ge=0,
        le=MAX_WAIT_S,
        description="Added to torchft's timeouts where they bound a phase (the step floor, a "
        "quorum wait).",
    )


class HealthConfig(Section):
    """The node's health checks (daemon/health/), run before the node claims a seat and
    every interval_s after. An unhealthy node claims no seat and says why (/status, /readyz,
    phalanx status, the metric phalanx_node_healthy); it claims once healthy again."""

    interval_s: float = Field(
        10.0, ge=0.1, le=MAX_WAIT_S, description="How often the checks run (0.1 s to one day)."
    )
    min_free_gb: float = Field(
        1.0,
        ge=0,
        le=1e6,
        description="Free space (GB) checkpoint.dir's volume must have while it holds no "
        "complete checkpoint of this job; once it does, the newest one's size x 1.1 (what the "
        "next save needs). The directory must also be writable. Unchecked without "
        "checkpoint.dir.",
    )
    devices: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Devices this node must have. On CUDA, GPUs visible (nvidia-smi -L, within "
        "CUDA_VISIBLE_DEVICES; nvidia-smi must also answer); 0 = node.nproc. On CPU, the CPU "
        "cores the daemon may run on (its affinity); 0 = not checked.",
    )
    max_clock_offset_s: float = Field(
        5.0,
        ge=0,
        le=MAX_WAIT_S,
        description="Largest offset of this node's wall clock from etcd's (read from the Date "
        "of etcd's HTTP answer, 1 s resolution: only an offset that is surely larger fails); "
        "0 = not checked. An etcd that does not answer leaves it unmeasured, not failed.",
    )
    min_free_memory_gb: float = Field(
        0.5,
        ge=0,
        le=1e6,
        description="Memory (GB) that must be available: MemAvailable, or what the daemon's "
        "cgroup limit leaves if less; 0 = not checked. The ranks' own use counts while they "
        "run, so keep it below what they leave free.",
    )
    leave_after: int = Field(
        3,
        ge=0,
        le=1_000_000,
        description="Checks failed in a row after which a node holding a seat gives it back "
        "(its ranks stop); a running node does so only while job.min_replicas other groups "
        "run on healthy nodes, so a fault every node shares (a full shared volume) stops no "
        "training. 0 = never: an unhealthy node that holds a seat keeps it and only says so.",
    )
