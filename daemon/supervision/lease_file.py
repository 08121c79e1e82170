"""The node's lease and its last confirmation, and the lighthouse notice: files its ranks read.

``<run_dir>/lease.json`` (``PHALANX_LEASE_FILE``) holds the etcd lease the node
trains under and when etcd last confirmed it; the writer group's rank 0 marks a
checkpoint complete only once the lease it held at the save's step is confirmed
after that step (``trainer.checkpoint.lease_fence``). Written atomically, and only
when the confirmation changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class LeaseFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: tuple[str, float] | None = None

    def write(self, confirmation: tuple[str, float] | None) -> None:
        """`confirmation`: (lease, when confirmed, epoch seconds), or None (nothing new)."""
        if confirmation is None or confirmation == self._written:
            return
        lease, confirmed = confirmation
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"lease": lease, "confirmed_ns": int(confirmed * 1e9)}))
        os.replace(tmp, self.path)
        self._written = confirmation


def write_notice(path: Path, seq: int, lighthouse: str, reason: str) -> None:
    """``<run_dir>/notice.json`` (``PHALANX_NOTICE``): the lighthouse moved, read by
    ``trainer.ft.notice`` (which says what the ranks do); replaced atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"seq": seq, "lighthouse": lighthouse, "reason": reason}))
    os.replace(tmp, path)
