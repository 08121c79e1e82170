"""A save between its start and its marker: what the saver keeps while DCP writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.checkpoint.lease_fence import Stamp


@dataclass
class PendingSave:
    """One save in flight (trainer/checkpoint/saver.py), mutated only by the saver."""

    step: int
    path: Path
    started: float  # time.monotonic() at its start
    blocked: float  # seconds training could not proceed, so far
    stamp: Stamp | None = None  # rank 0's lease reading at the start (lease_fence.py)
    files: dict[str, Any] | None = None  # rank 0: name -> size and checksum, once written
    error: BaseException | None = None  # its staging failed: finish() reports it
