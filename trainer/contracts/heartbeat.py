"""A rank's heartbeat file, the contract between the rank that writes it and its daemon's
hang detection and failure notice that read it (daemon/ranks/hang.py,
daemon/ranks/failure_notice.py).

Its path is ``<run_dir>/heartbeat/rank-<local rank>`` (:func:`path`), given to the rank
as ``PHALANX_HEARTBEAT``. Each call to :meth:`Heartbeat.enter` replaces the file with
the phase the rank enters, one of :data:`PHASES`: ``start``, ``load``, ``step``,
``quorum``, ``heal``, ``save``, ``eval`` or ``finish``. Every write is progress; the
phase tells the daemon how long the rank may stay silent next. A ``step`` beat that
ends a stretch spent in steps carries its seconds (``step_s``), from which the daemon
learns the steady-step timeout. Every beat also carries the id of the rank's last
torchft quorum once it has one (``quorum_id``, :meth:`Heartbeat.note_quorum`): when
the rank dies, its daemon announces the failure to the other groups' ranks in that
quorum. Nothing is read from a device: a beat never syncs a GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DIRECTORY = "heartbeat"  # under the run directory


def path(run_dir: Path, rank: int) -> Path:
    """The heartbeat file of local rank `rank`."""
    return run_dir / DIRECTORY / f"rank-{rank}"


PHASES = ("start", "load", "step", "quorum", "heal", "save", "eval", "finish")


@dataclass(frozen=True)
class Beat:
    """What a heartbeat file says: the phase entered, the seconds the step before it
    took where it is a step's end (None otherwise), and the rank's last quorum."""

    phase: str = "start"
    step_s: float | None = None
    quorum_id: int | None = None  # the rank's last torchft quorum, once it had one


def read_beat(path: Path) -> Beat:
    """The beat in `path`; an empty file (the daemon's at spawn) or one being rewritten
    reads as the start."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return Beat()
    if not isinstance(data, dict):
        return Beat()
    phase = data.get("phase")
    step_s = data.get("step_s")
    quorum_id = data.get("quorum_id")
    return Beat(
        phase if phase in PHASES else "start",
        float(step_s) if isinstance(step_s, int | float) and math.isfinite(step_s) else None,
        quorum_id if isinstance(quorum_id, int) and not isinstance(quorum_id, bool) else None,
    )


class Heartbeat:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._tmp = path.with_name(f".{path.name}.tmp") if path is not None else Path()
        self._lock = threading.Lock()  # torchft's quorum thread beats for a heal
        self._phase = "start"
        self._since = time.monotonic()
        self._quorum_id: int | None = None

    def enter(self, phase: str) -> None:
        """Say that this rank enters `phase` (progress, whatever the phase)."""
        if self.path is None:
            return
        with self._lock:
            now = time.monotonic()
            beat: dict[str, object] = {"phase": phase}
            if phase == "step" and self._phase == "step":
                beat["step_s"] = round(now - self._since, 6)
            self._phase, self._since = phase, now
            self._write(beat)

    def note_quorum(self, quorum_id: int) -> None:
        """Say which quorum this rank is in now (torchft's quorum thread, once per new id):
        the beat of the phase under way is written again with it, adding no step time."""
        if self.path is None or quorum_id == self._quorum_id:
            return
        with self._lock:
            self._quorum_id = quorum_id
            self._write({"phase": self._phase})

    def _write(self, beat: dict[str, object]) -> None:
        if self._quorum_id is not None:
            beat["quorum_id"] = self._quorum_id
        # Replaced whole, never rewritten in place: the daemon reads a beat when the
        # file's mtime changes, which is coarser than a write, so it must never find a
        # half-written one. OSError: the run directory went away (we are being stopped).
        assert self.path is not None
        with contextlib.suppress(OSError):
            self._tmp.write_text(json.dumps(beat))
            os.replace(self._tmp, self.path)
