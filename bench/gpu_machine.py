"""What `make gpu-check`'s figures were measured on (bench/gpu_check.py): the card, its
driver, the torch, CUDA and torchft versions, the process-group backend a group asks
for, and the commit."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def machine(name: str | None) -> dict[str, Any]:
    """What the figures were measured on: card, driver, versions, commit."""
    import torch

    def out(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip()

    try:
        from importlib.metadata import version

        torchft = version("torchft")
    except Exception:
        torchft = "absent"
    import torch.distributed as dist

    from trainer.parallel.mesh import group_backend

    return {
        "card": name,
        # What a group of several ranks on this torch asks for (its checks here run groups
        # of one rank, which make no process group of their own).
        "group_backend_cuda": group_backend("cuda", dist.Backend.backend_list),
        "backends_registered": list(dist.Backend.backend_list),
        "driver": out(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torchft": torchft,
        "python": sys.version.split()[0],
        # A copy of the tree without .git (a lent machine's) names its commit in the env.
        "commit": os.environ.get("PHALANX_COMMIT")
        or out(["git", "rev-parse", "HEAD"])
        or "unknown",
        "dirty": bool(out(["git", "status", "--porcelain", "--untracked-files=no"])),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
