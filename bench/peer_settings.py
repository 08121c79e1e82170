"""What every system of bench/peers.py trains, in one place (torch-free).

The built-in Llama of trainer/workloads/llama/model.py (dim 256, 4 layers, vocab 256, 4 heads) on
the built-in synthetic bigram corpus, 128 tokens per row, 8 rows per rank per step
(``PHALANX_BENCH_ROWS``: a shorter or longer step; the benches' ``--rows`` set it, and
their workers inherit it), AdamW with the trainer's defaults. Phalanx reads these as a job file; the peer
workers (bench/peer_ddp.py, bench/peer_torchft.py) build the same model, data and
optimizer from :func:`trainer_config`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from trainer.config import TrainerConfig, validate

JOB = "bench"
GROUPS = 2  # ranks of the DDP world; replica groups of torchft and Phalanx
ROWS_ENV = "PHALANX_BENCH_ROWS"


def rows() -> int:
    """Rows per rank per step: 8, or ``PHALANX_BENCH_ROWS``."""
    return int(os.environ.get(ROWS_ENV, "8"))


STEPS = 1_000_000  # nothing finishes inside a run
MODEL: dict[str, Any] = {
    "vocab_size": 256,
    "dim": 256,
    "n_layers": 4,
    "n_heads": 4,
    "max_seq_len": 128,
}


def train() -> dict[str, Any]:
    """The train section, at rows() rows per rank per step. Phalanx's global batch is
    both groups' rows: a group alone trains all of them (two micro-batches); torchrun's
    and torchft's workers read rows() each (bench/peer_worker.py)."""
    return {
        "seq_len": 128,
        "batch_size": rows(),
        "global_batch_size": GROUPS * rows(),
        "steps": STEPS,
        "log_every": 1,
    }


def trainer_config() -> TrainerConfig:
    """The trainer sections every system trains with (defaults elsewhere)."""
    return validate(TrainerConfig, {"model": MODEL, "train": train()}, "bench/peer_settings.py")


def job_toml(writer: str, sections: dict[str, dict[str, Any]]) -> str:
    """A job file of these sections (values are numbers, booleans, strings or lists of
    them, written as JSON, which TOML reads the same)."""
    lines = [f"# Written by {writer}."]
    for name, values in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def phalanx_job() -> str:
    """The job file of the Phalanx run: these settings, two one-rank groups, every other
    section (lighthouse, node, ft, etcd) at the project's defaults; per-node settings
    (ids, ports, run directories, etcd) come with --set."""
    sections: dict[str, dict[str, Any]] = {
        "job": {"name": JOB, "min_replicas": 1, "max_replicas": GROUPS},
        "node": {"nproc": 1, "advertise_host": "127.0.0.1"},
        "model": MODEL,
        "train": train(),
    }
    return job_toml("bench/peers.py", sections)
