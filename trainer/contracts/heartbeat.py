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
quorum. Nothing is read from a device: a beat never syncs a GPU. The training loop's
step beats are written by a thread of their own (``background``), so the step loop does
no file I/O; a step beat the thread has not written yet when a newer one comes is
replaced by it (the daemon needs progress, not every step's seconds).
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
    """This rank's beats. With `background` (the training loop's), a ``step`` beat is
    handed to a writer thread and :meth:`enter` returns at once: a failure-free step does
    no file I/O and never waits for one (issue 52). Every other phase is written before
    :meth:`enter` returns, because the daemon must see a longer phase (a save, a heal,
    the finish) before the rank spends its time there, and a step beat still waiting is
    dropped for it: writes are serialised and a file never goes back to an older beat.
    A rank that hangs stops entering phases, so its file stops changing whichever thread
    writes it."""

    def __init__(self, path: Path | None, background: bool = False) -> None:
        self.path = path
        self._tmp = path.with_name(f".{path.name}.tmp") if path is not None else Path()
        # Lock order: _file_lock, then _lock. _lock guards the fields below and is never
        # held across file I/O, so a step's beat never waits for a write in flight.
        self._file_lock = threading.Lock()
        self._lock = threading.Lock()  # torchft's quorum thread beats for a heal
        self._wake = threading.Condition(self._lock)
        self._background = background
        self._phase = "start"
        self._since = time.monotonic()
        self._quorum_id: int | None = None
        self._entered = 0  # beats entered, numbered from 1
        self._written = 0  # the newest beat in the file
        self._pending: tuple[int, dict[str, object]] | None = None  # for the writer thread
        self._writer: tuple[int, threading.Thread] | None = None  # (pid, thread)

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
            self._entered += 1
            number = self._entered
            if self._background and phase == "step":
                self._pending = (number, beat)
                self._start_writer()
                self._wake.notify_all()
                return
            self._pending = None  # this beat is newer
        self._write(number, beat)

    def note_quorum(self, quorum_id: int) -> None:
        """Say which quorum this rank is in now (torchft's quorum thread, once per new id):
        the beat of the phase under way is written again with it, adding no step time."""
        if self.path is None or quorum_id == self._quorum_id:
            return
        with self._lock:
            self._quorum_id = quorum_id
            if self._pending is not None:  # the writer adds the id to the beat it writes
                return
            self._entered += 1
            number = self._entered
            beat: dict[str, object] = {"phase": self._phase}
        self._write(number, beat)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the newest beat entered is in the file (the background writer's
        too); False if `timeout` seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._entered
            while self.path is not None and self._written < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
            return True

    def _start_writer(self) -> None:
        """The writer thread, started on the first background beat of this process (a
        rank forked from a zygote does not inherit its parent's thread); _lock is held."""
        pid = os.getpid()
        if self._writer is not None and self._writer[0] == pid:
            return
        thread = threading.Thread(target=self._write_pending, name="phalanx-heartbeat", daemon=True)
        self._writer = (pid, thread)
        thread.start()

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                while self._pending is None:
                    self._wake.wait()
                number, beat = self._pending
                self._pending = None
            self._write(number, beat)

    def _write(self, number: int, beat: dict[str, object]) -> None:
        """Write beat `number` unless a newer one is in the file."""
        with self._file_lock:
            with self._lock:
                if number <= self._written:
                    return
                if self._quorum_id is not None:
                    beat["quorum_id"] = self._quorum_id
            # Replaced whole, never rewritten in place: the daemon reads a beat when the
            # file's mtime changes, which is coarser than a write, so it must never find a
            # half-written one. OSError: the run directory went away (we are being stopped).
            assert self.path is not None
            with contextlib.suppress(OSError):
                self._tmp.write_text(json.dumps(beat))
                os.replace(self._tmp, self.path)
            with self._lock:
                self._written = number
                self._wake.notify_all()  # flush()
