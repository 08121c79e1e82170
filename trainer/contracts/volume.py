"""The free space of the checkpoint volume, measured one way by both sides: the daemon's
health probe sizes the next save with it before a node claims a seat
(``daemon/health/probes.py``), a rank refuses a save that would not fit
(``trainer/checkpoint/space.py``). Torch-free."""

from __future__ import annotations

import shutil
from pathlib import Path


def free_bytes(directory: Path) -> int | None:
    """Free bytes for an unprivileged writer on the volume of `directory` (or of its
    nearest existing ancestor: a checkpoint directory not made yet); None when none can
    be read."""
    for d in (directory, *directory.parents):
        try:
            return shutil.disk_usage(d).free  # f_bavail: what an unprivileged writer gets
        except OSError:
            continue
    return None
