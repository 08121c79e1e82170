"""``<run_dir>/lease.json`` (``PHALANX_LEASE_FILE``): the node's etcd lease and when etcd
last confirmed it, written by the daemon (``daemon/fencing/lease_file.py``) and read
by the writer group's rank 0 before it marks a checkpoint complete
(``trainer.checkpoint.lease_fence``). Both sides use this module.

``{"lease": "<hex id>", "confirmed_ns": <CLOCK_MONOTONIC ns>}``, replaced whole (a
rename, so a reader never sees half a file). Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

NAME = "lease.json"  # in the node's run directory


def write(path: Path, lease: str, confirmed_s: float) -> None:
    """The lease and its confirmation time (CLOCK_MONOTONIC seconds), atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"lease": lease, "confirmed_ns": int(confirmed_s * 1e9)}))
    os.replace(tmp, path)


def read(path: Path) -> tuple[str, int] | None:
    """(lease, confirmed ns); None while the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        return str(data["lease"]), int(data["confirmed_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
