"""What a checkpoint directory holds on disk, when it can be trusted, and which ones to keep.

A run's checkpoints live in ``<checkpoint.dir>/<job>/run-<id>/`` (:func:`run_root`):
the id covers what makes two runs different (model, data, seed, batch), so runs
sharing ``checkpoint.dir`` never resume from or delete each other's checkpoints.
``<root>/step-<N>/`` holds DCP's files, ``train_state.json`` and, once the save
is complete, ``COMPLETE.json``: the step, layout, model hash, time and every
file's size and SHA-256 (computed off the training path, see
``trainer.checkpoint.saver``). A checkpoint is valid only when its marker, every size
and every checksum check out; nothing else is loaded or counted by retention.
Torch-free, so unit tests and tools can use it alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.contracts.checkpoint_names import MARKER as MARKER  # re-exported
from trainer.contracts.checkpoint_names import NO_MARKER as NO_MARKER  # re-exported
from trainer.contracts.checkpoint_names import RUN_PREFIX, STEP_PREFIX
from trainer.contracts.checkpoint_names import SCALARS as SCALARS  # re-exported

PREFIX = STEP_PREFIX
CHECKSUM = "sha256"  # about 1.3 GB/s on this machine's CPUs (SHA extensions)
FOREIGN = "saved for a different model configuration"
LOCAL_JOB = "local"  # the job directory of a run outside a daemon (torchrun, python -m trainer)
RUN_SECTIONS = ("model", "data")
RUN_TRAIN_KEYS = ("seed", "seq_len")


def run_identity(config: dict[str, Any]) -> str:
    """``run-<12 hex>`` of a resolved trainer config: model, data, workload, seed and batch."""
    train = config.get("train") or {}
    picked = {name: config.get(name) for name in RUN_SECTIONS}
    # The items of each step (train.global_batch_size, 0 = batch_size); not the micro-batch.
    global_batch = train.get("global_batch_size") or train.get("batch_size")
    picked["train"] = {
        **{key: train.get(key) for key in RUN_TRAIN_KEYS},
        "global_batch": global_batch,
    }
    workload = config.get("workload") or {}
    if workload.get("spec"):  # a user's workload; the built-in's ids are unchanged
        picked["workload"] = {"spec": workload["spec"], "options": workload.get("options")}
    blob = json.dumps(picked, sort_keys=True, separators=(",", ":"))
    return RUN_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_root(base: Path, job: str | None, config: dict[str, Any]) -> Path:
    """Where a run keeps its checkpoints: ``<base>/<job>/run-<id>``."""
    return base / (job or LOCAL_JOB) / run_identity(config)


def resume_source(path: Path) -> tuple[Path, int | None]:
    """``checkpoint.resume_from``: a ``step-<N>`` directory (its run directory and N) or
    a run directory (itself, None: its newest valid checkpoint)."""
    number = path.name.removeprefix(PREFIX)
    if path.name.startswith(PREFIX) and number.isdigit():
        return path.parent, int(number)
    return path, None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write, fsync, rename, fsync the directory: the file is either absent or whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a rename, a new subdirectory) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checksum(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, CHECKSUM).hexdigest()


def describe_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Every file of a written checkpoint (but the marker) with its size and checksum."""
    return {
        p.name: {"size": p.stat().st_size, CHECKSUM: checksum(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MARKER
    }


@dataclass(frozen=True)
class Candidate:
    step: int
    path: Path

    @property
    def marked(self) -> bool:
        return (self.path / MARKER).is_file()


def candidates(root: Path) -> list[Candidate]:
    """Every step-<N> directory under root, newest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        number = entry.name.removeprefix(PREFIX)
        if entry.is_dir() and entry.name.startswith(PREFIX) and number.isdigit():
            found.append(Candidate(int(number), entry))
    return sorted(found, key=lambda c: c.step, reverse=True)


def saved_at(path: Path) -> float | None:
    """When the save at `path` finished (its marker's time), None without a readable one:
    which save a refusal refused, where a later save of the same step took the name."""
    try:
        value = json.loads((path / MARKER).read_text()).get("time")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def problem(candidate: Candidate, model_hash: str) -> str | None:
    """Why a checkpoint directory cannot be trusted, or None if it can (reads every file)."""
    marker_path = candidate.path / MARKER
    if not marker_path.is_file():
        return NO_MARKER
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return f"unreadable completion marker ({e})"
    if marker.get("model_hash") != model_hash:
        return FOREIGN
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return "the completion marker lists no files"
    for name, recorded in files.items():
        path = candidate.path / name
        if not isinstance(recorded, dict) or CHECKSUM not in recorded:
            return f"the completion marker has no {CHECKSUM} of {name}"
        if not path.is_file():
            return f"{name} is missing"
        try:
            size = path.stat().st_size
            if size != recorded.get("size"):
                return f"{name} has {size} bytes, the marker says {recorded.get('size')}"
            if checksum(path) != recorded[CHECKSUM]:
                return f"{name} does not match its {CHECKSUM} (the file changed after the save)"
        except OSError as e:
            return f"{name} cannot be read ({e.strerror})"
    return None


@dataclass
class Retention:
    removed: list[Path] = field(default_factory=list)
    # Invalid directories newer than the newest valid checkpoint: left alone (a save in
    # flight, or one somebody should look at) and reported with the reason.
    suspicious: dict[Path, str] = field(default_factory=dict)


def retain(root: Path, keep: int, model_hash: str, trusted: set[Path] | None = None) -> Retention:
    """Keep the newest `keep` valid checkpoints; delete older valid ones and invalid ones
    older than the newest valid; never delete the newest valid one, nor an invalid one
    newer than it, nor another model's. `trusted` paths are known valid (checked or written by this process);
    those found valid are added to it, so each directory is read in full once."""
    trusted = trusted if trusted is not None else set()
    valid: list[Candidate] = []
    invalid: dict[Candidate, str] = {}
    for c in candidates(root):
        why = None if c.path in trusted else problem(c, model_hash)
        if why == FOREIGN:
            continue  # another model's checkpoint: not ours to count or delete
        if why is None:
            valid.append(c)
            trusted.add(c.path)
        else:
            invalid[c] = why
    result = Retention()
    if not valid:
        result.suspicious = {c.path: why for c, why in invalid.items()}
        return result
    newest = valid[0].step
    result.removed = [c.path for c in valid[max(1, keep) :]]
    result.removed += [c.path for c in invalid if c.step < newest]
    result.suspicious = {c.path: why for c, why in invalid.items() if c.step > newest}
    for path in result.removed:
        shutil.rmtree(path, ignore_errors=True)
        trusted.discard(path)
    return result
