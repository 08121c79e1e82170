"""How the daemon's previous life on this run directory ended: ``<run_dir>/life.json``.

Each daemon writes the file as it starts, again when it becomes or stops being the
leader, and once more as it exits (``ended``). A daemon that finds the file of a
predecessor that never said it ended knows that life was lost (SIGKILL, a crash, the
host down): the node's incident (``node_lost``, or ``leader_lost`` if it led the job).
The predecessor's last sign of life is the newest of its ranks' heartbeats (they beat
every step and die with their daemon), else the file's own time.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from trainer.contracts import heartbeat

NAME = "life.json"


@dataclass(frozen=True)
class Lost:
    """A predecessor that ended without saying so."""

    leading: bool  # it led the job when last written
    last_seen: float  # epoch s: its last sign of life


def last_life(run_dir: Path) -> Lost | None:
    """The predecessor's life if it was lost, else None (none, or it ended)."""
    path = run_dir / NAME
    try:
        life = json.loads(path.read_text())
        written = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    if not isinstance(life, dict) or life.get("ended"):
        return None
    beats = [written]
    with contextlib.suppress(OSError):
        beats += [p.stat().st_mtime for p in (run_dir / heartbeat.DIRECTORY).iterdir()]
    return Lost(bool(life.get("leading")), max(beats))


def write_life(run_dir: Path, *, leading: bool = False, ended: bool = False) -> None:
    """Say how this life stands (atomically; a failure to write costs only the record)."""
    path = run_dir / NAME
    fresh = path.with_suffix(".tmp")
    try:
        fresh.write_text(json.dumps({"pid": os.getpid(), "leading": leading, "ended": ended}))
        fresh.replace(path)
    except OSError:
        pass
