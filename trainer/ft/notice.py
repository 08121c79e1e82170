"""What the daemon tells its ranks at once: the lighthouse moved (``PHALANX_NOTICE``).

When the published lighthouse changes (the leader's node died or was cut off, and
another node took over), ranks may be blocked in a collective with a group that
will never answer (a cut-off host sends no reset) or in a quorum of the old
lighthouse; torchft would let them wait out ``ft.timeout_s``. The daemon writes
``{"seq", "lighthouse", "reason"}`` to the file named by ``PHALANX_NOTICE`` (a
rename, so a reader never sees half of it; ``daemon.supervision.lease_file``), ``seq`` one more each time. A rank
reads it while it waits for a collective (:meth:`Notice.changed`, a ``stat`` every
:data:`POLL_S`, a read only when the file changed) and abandons the step when the
sequence moved past the one it last acted on: the step fails everywhere
(``report_error``), and the next quorum is asked of the new lighthouse.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_S = 0.05  # how often a waiting rank looks at the file


@dataclass(frozen=True)
class Told:
    seq: int
    lighthouse: str
    reason: str


class Notice:
    """The daemon's notice file as one rank reads it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._seen = 0
        self._last: Told | None = None
        told = self._read()
        if told is not None:  # what was said before this rank started is not news
            self._seen = told.seq

    def changed(self) -> Told | None:
        """The notice, once, when its sequence moved past the last one returned."""
        told = self._read()
        if told is None or told.seq <= self._seen:
            return None
        self._seen = told.seq
        return told

    def _read(self) -> Told | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return self._last
        self._stamp = stamp
        try:
            raw = json.loads(self.path.read_text())
            self._last = Told(int(raw["seq"]), str(raw["lighthouse"]), str(raw.get("reason", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return self._last
        return self._last


def wait_unless_told(work: Any, pending: Any, notice: Notice) -> Told | None:
    """Wait for `work` (``work.wait()``) unless a notice comes while `pending` (the
    process group's own work behind it) still runs: then that notice, and `work` is left
    unwaited. No host sync is added: on CUDA the future completes when the collective
    is enqueued."""
    done = threading.Event()
    try:
        pending.get_future().add_done_callback(lambda _: done.set())
    except (RuntimeError, AttributeError):  # no future (a dummy work after an error)
        done.set()
    while not done.wait(POLL_S):
        told = notice.changed()
        if told is not None:
            return told
    work.wait()
    return None


class StepWaits:
    """The collective waits of one step: once a notice abandons one, every later one of
    the step is abandoned at once (a bucket issued before it, on the same process group,
    would otherwise wait out its own timeout)."""

    def __init__(self, notice: Notice) -> None:
        self.notice = notice
        self.told: Told | None = None  # the notice that abandoned this step

    def new_step(self) -> None:
        self.told = None

    def wait(self, work: Any, pending: Any) -> Told | None:
        """None once `work` is done; the notice when the step is abandoned (now or before)."""
        if self.told is None:
            self.told = wait_unless_told(work, pending, self.notice)
            return self.told
        return self.told
