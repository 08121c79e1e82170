"""This rank's progress heartbeat, read by its daemon's hang detection.

Each call to :meth:`Heartbeat.enter` rewrites a small file (``PHALANX_HEARTBEAT``)
with the phase the rank enters: ``start``, ``load``, ``step``, ``quorum``, ``heal``,
``save``, ``eval`` or ``finish``. Every write is progress; the phase tells the daemon
how long the rank may stay silent next (``daemon/ranks/hang.py``). A ``step`` beat
that ends a stretch spent in steps carries its seconds, from which the daemon learns
the steady-step timeout. Every beat also carries the id of the rank's last torchft
quorum once it has one (:meth:`Heartbeat.note_quorum`): when the rank dies, its daemon
announces the failure to the other groups' ranks in that quorum
(``daemon.ranks.failure_notice``). Nothing is read from a device: a beat never
syncs a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path


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
