"""When the daemon must read its job from etcd again: one watch on ``/phalanx/<job>/``.

The supervisor's round used to read the whole job (one range request) and campaign
for leadership (one transaction) four times a second, on a node whose cores its
ranks use: every request is CPU taken from them twice, the daemon's and etcd's.
Now a round reads the job only when :meth:`JobWatch.due` says so:

* something under the job's prefix changed since the last read (the watch said so),
  other than this daemon's own record, which only it writes;
* the watch is not established (before the first read, after an error, after a
  fence): every round reads, as before;
* the last read is older than :data:`MAX_AGE_S`, so a stream that went quiet
  without an error (a partition) cannot leave the view stale for long.

The watch starts at the revision after the read that armed it: no change made
between that read and the watch is missed. A change wakes the supervisor's loop
at once (``wake``), so the daemon also learns of one sooner than a 0.25 s poll did.
The watch runs on the coordinator's connection; when that connection is discarded
after an error, the stream ends, the watch disarms itself and the next read arms
a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from pyetcd.events import PutEvent

from daemon.coordination.etcd_client import CoordinationError
from trainer import logs

MAX_AGE_S = 2.0


class Watchable(Protocol):
    """What the watch needs of :class:`daemon.coordination.coordinator.Coordinator`."""

    def watch_job(self, start_revision: int, callback: Callable[[Any], None]) -> int: ...

    def cancel_watch(self, watch_id: int) -> None: ...


class JobWatch:
    """A dirty flag for the job view, set from etcd's watch stream (its own thread)."""

    def __init__(self, own_key: str, wake: Callable[[], None] | None = None) -> None:
        self.own_key = own_key.encode()
        self.wake = wake or (lambda: None)
        self.log = logs.get()
        self._lock = threading.Lock()
        self._dirty = True
        self._watch_id: int | None = None
        self._generation = 0  # callbacks of a watch given up are ignored
        self.changes = 0  # change notifications that called for a read
        self._failing = False  # the last attempt to create a watch failed (reported)

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._watch_id is not None

    def due(self, age_s: float) -> bool:
        """Whether this round must read the job (the last read is `age_s` old)."""
        with self._lock:
            return self._dirty or self._watch_id is None or age_s >= MAX_AGE_S

    def reading(self) -> None:
        """Called just before a read: a change from now on calls for another one."""
        with self._lock:
            self._dirty = False

    def invalidate(self) -> None:
        """Read again next round (after a fence, a new session, a failed read)."""
        with self._lock:
            self._dirty = True

    def arm(self, coord: Watchable, start_revision: int) -> None:
        """Watch from `start_revision` (the read's revision + 1) unless already watching.

        A watch that cannot be created is reported once (until one is created again); the
        watch then stays unarmed and every round reads, as without a watch."""
        with self._lock:
            if self._watch_id is not None:
                return
            self._generation += 1
            generation = self._generation
        try:
            watch_id = coord.watch_job(start_revision, lambda r: self._on_response(generation, r))
        except CoordinationError as e:
            if not self._failing:
                self.log.warning("etcd_watch_failed", error=str(e), reads="every round")
            self._failing = True
            return
        self._failing = False
        with self._lock:
            if generation == self._generation:
                self._watch_id = watch_id
                return
        self._cancel(coord, watch_id)  # disarmed while it was being created

    def disarm(self, coord: Watchable | None = None) -> None:
        """Stop trusting the stream: every round reads until a read arms a new watch."""
        with self._lock:
            watch_id, self._watch_id = self._watch_id, None
            self._generation += 1
            self._dirty = True
        if watch_id is not None and coord is not None:
            self._cancel(coord, watch_id)

    def _cancel(self, coord: Watchable, watch_id: int) -> None:
        try:
            coord.cancel_watch(watch_id)
        except Exception as e:  # the stream may be gone with its connection already
            self.log.debug("etcd_watch_cancel_failed", error=str(e))

    def _on_response(self, generation: int, response: Any) -> None:
        """On pyetcd's watch thread: a batch of events, or an error / None when the
        stream ended."""
        events = getattr(response, "events", None)
        with self._lock:
            if generation != self._generation:
                return
            if events is None:  # the stream ended: read every round until re-armed
                self._watch_id, self._dirty = None, True
                self._generation += 1
            elif any(not (isinstance(e, PutEvent) and e.key == self.own_key) for e in events):
                self._dirty = True
                self.changes += 1
            else:
                return  # only our own record, or a progress notification
        self.wake()
