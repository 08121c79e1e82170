"""What the daemon tells its ranks at once (``PHALANX_NOTICE``): the lighthouse moved,
or the lighthouse lost members of a quorum.

When the published lighthouse changes (the leader's node died or was cut off, and
another node took over), ranks may be blocked in a collective with a group that
will never answer (a cut-off host sends no reset) or in a quorum of the old
lighthouse; torchft would let them wait out ``ft.timeout_s``. The same holds for a
collective with a group whose host lost power, which the leader's lighthouse notices
when its heartbeats stop. The daemon keeps its last few notices in the file named by
``PHALANX_NOTICE`` (its format in ``trainer/contracts/notice_file.py``, written by
``daemon.supervision.rank_notice``), ``seq`` one more each time. A rank reads it
while it waits for a collective (:meth:`Notice.changed`, a ``stat`` every
:data:`POLL_S`, a read only when the file changed) and abandons the step when a notice
it has not seen concerns it (a move always does; members lost only while the rank's
own quorum is the one they were lost from): the step fails everywhere
(``report_error``), and the next quorum is asked for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.contracts import notice_file
from trainer.contracts.notice_file import Told

__all__ = ["Notice", "StepWaits", "Told", "wait_unless_told"]

POLL_S = 0.05  # how often a waiting rank looks at the file


Concerns = Callable[[Told], bool]  # whether a notice is about this rank's step


def _always(told: Told) -> bool:
    return True


class Notice:
    """The daemon's notice file as one rank reads it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()  # the quorum thread reads it too (entries)
        self._stamp: tuple[int, int] | None = None
        self._last: tuple[Told, ...] = ()
        self._seen = self.newest_seq()  # what was said before this rank started is not news

    def changed(self, concerns: Concerns = _always) -> Told | None:
        """The first notice not returned or passed over before that `concerns` this rank;
        every notice read is then seen, whether it concerned the rank or not."""
        unseen = [t for t in self.entries() if t.seq > self._seen]
        if not unseen:
            return None
        self._seen = max(t.seq for t in unseen)
        return next((t for t in unseen if concerns(t)), None)

    def newest_seq(self) -> int:
        return max((t.seq for t in self.entries()), default=0)

    def entries(self) -> tuple[Told, ...]:
        """The notices the file holds now, oldest first, seen or not."""
        if self.path is None:
            return ()
        with self._lock:
            return self._read(self.path)

    def _read(self, path: Path) -> tuple[Told, ...]:
        try:
            st = os.stat(path)
        except OSError:
            return ()
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return self._last
        self._stamp = stamp
        try:
            self._last = notice_file.read(path)
        except (OSError, ValueError):
            return self._last
        return self._last


def wait_unless_told(
    work: Any, pending: Any, notice: Notice, concerns: Concerns = _always
) -> Told | None:
    """Wait for `work` (``work.wait()``) unless a notice that `concerns` the rank comes
    while `pending` (the process group's own work behind it) still runs: then that
    notice, and `work` is left unwaited. No host sync is added: on CUDA the future
    completes when the collective is enqueued."""
    done = threading.Event()
    try:
        pending.get_future().add_done_callback(lambda _: done.set())
    except (RuntimeError, AttributeError):  # no future (a dummy work after an error)
        done.set()
    while not done.wait(POLL_S):
        told = notice.changed(concerns)
        if told is not None:
            return told
    work.wait()
    return None


class StepWaits:
    """The collective waits of one step: once a notice abandons one, every later one of
    the step is abandoned at once (a bucket issued before it, on the same process group,
    would otherwise wait out its own timeout)."""

    def __init__(self, notice: Notice, concerns: Concerns = _always) -> None:
        self.notice = notice
        self.concerns = concerns
        self.told: Told | None = None  # the notice that abandoned this step

    def new_step(self) -> None:
        self.told = None

    def wait(self, work: Any, pending: Any) -> Told | None:
        """None once `work` is done; the notice when the step is abandoned (now or before)."""
        if self.told is None:
            self.told = wait_unless_told(work, pending, self.notice, self.concerns)
            return self.told
        return self.told
