"""The node's lease and its last confirmation: a file its ranks read.

``<run_dir>/lease.json`` (``PHALANX_LEASE_FILE``, ``trainer/contracts/lease_file.py``)
holds the etcd lease the node trains under and when etcd last confirmed it; the writer
group's rank 0 marks a checkpoint complete only once the lease it held at the save's
step is confirmed after that step (``trainer.checkpoint.lease_fence``). Written
atomically, and only when the confirmation changed.
"""

from __future__ import annotations

from pathlib import Path

from trainer.contracts import lease_file


class LeaseFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: tuple[str, float] | None = None

    def write(self, confirmation: tuple[str, float] | None) -> None:
        """`confirmation`: (lease, when confirmed, CLOCK_MONOTONIC seconds), or None
        (nothing new)."""
        if confirmation is None or confirmation == self._written:
            return
        lease_file.write(self.path, *confirmation)
        self._written = confirmation
