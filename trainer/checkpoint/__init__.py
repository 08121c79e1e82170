"""Checkpoints on disk: the asynchronous DCP saver, resuming from the newest valid
checkpoint, the run directories and completion markers with checksums, loading
files safely, and the lease fence that stops a rank whose daemon lost its lease.
"""

from __future__ import annotations

from trainer.checkpoint.files import (
    MARKER,
    Candidate,
    candidates,
    describe_files,
    problem,
    resume_source,
    retain,
    run_identity,
    run_root,
    write_json_atomic,
)
from trainer.checkpoint.lease_fence import Confirmation, LeaseFence
from trainer.checkpoint.safe_load import SafeReader
from trainer.checkpoint.saver import Checkpointer

__all__ = [
    "MARKER",
    "Candidate",
    "Checkpointer",
    "Confirmation",
    "LeaseFence",
    "SafeReader",
    "candidates",
    "describe_files",
    "problem",
    "resume_source",
    "retain",
    "run_identity",
    "run_root",
    "write_json_atomic",
]
