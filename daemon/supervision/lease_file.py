"""The node's lease and its last confirmation, and the notices to the ranks: files its ranks read.

``<run_dir>/lease.json`` (``PHALANX_LEASE_FILE``) holds the etcd lease the node
trains under and when etcd last confirmed it; the writer group's rank 0 marks a
checkpoint complete only once the lease it held at the save's step is confirmed
after that step (``trainer.checkpoint.lease_fence``). Written atomically, and only
when the confirmation changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


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


def write_notice(path: Path, notices: Sequence[Mapping[str, Any]]) -> None:
    """``<run_dir>/notice.json`` (``PHALANX_NOTICE``): the daemon's last few notices to its
    ranks, oldest first, each ``{"seq", "lighthouse", "reason"}`` plus ``quorum_id`` and
    ``replicas`` for members lost; read by ``trainer.ft.notice`` (which says what the
    ranks do); replaced atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"notices": list(map(dict, notices))}))
    os.replace(tmp, path)
