"""What keeps the daemon's copy of its job current: one watch on ``/phalanx/<job>/``.

The job is read once (one range request) into ``daemon.coordination.job_cache``; from
then on the watch's events are queued here (:meth:`JobWatch.take`) and applied to that
copy by the supervisor's round, with no request. :meth:`JobWatch.due` says when the
round must read the whole job again instead:

* the watch is not established: before the first read, after its stream ended (an
  error, a restarted etcd, a discarded connection), after etcd compacted the revision
  it asked for, or after a fence (``invalidate`` / ``disarm``); every round reads until
  a read arms a new watch;
* the last full read is older than a jittered :data:`RESYNC_S` (a rare check against a
  stream that went quiet without an error; a partition is caught sooner, by the lease).

The watch starts at the revision after the read that armed it: no change made between
that read and the watch is missed. A change by another node wakes the supervisor's
loop at once (``wake``); this node's own record, which only it writes, is applied
quietly. The watch runs on the coordinator's connection; when that connection is
discarded after an error the stream ends, the watch disarms itself and the next read
arms a new one.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, Protocol

from pyetcd.events import PutEvent

from daemon.coordination.etcd_client import CoordinationError
from trainer import logs

RESYNC_S = 300.0  # a full read at most this often (x 0.8-1.2) while the watch holds


class Watchable(Protocol):
    """What the watch needs of :class:`daemon.coordination.coordinator.Coordinator`."""

    def watch_job(self, start_revision: int, callback: Callable[[Any], None]) -> int: ...

    def cancel_watch(self, watch_id: int) -> None: ...


class JobWatch:
    """The watch's events for the job view, queued from etcd's stream (its own thread)."""

    def __init__(self, own_key: str, wake: Callable[[], None] | None = None) -> None:
        self.own_key = own_key.encode()
        self.wake = wake or (lambda: None)
        self.log = logs.get()
        self._lock = threading.Lock()
        self._stale = True  # a full read is due
        self._pending: list[Any] = []  # events not applied yet, oldest first
        self._watch_id: int | None = None
        self._generation = 0  # callbacks of a watch given up are ignored
        self.changes = 0  # batches of events by other nodes (each woke the loop)
        self.resync_s = RESYNC_S
        self._failing = False  # the last attempt to create a watch failed (reported)

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._watch_id is not None

    def due(self, age_s: float) -> bool:
        """Whether this round must read the whole job (the last full read is `age_s` old)."""
        with self._lock:
            return self._stale or self._watch_id is None or age_s >= self.resync_s

    def reading(self) -> None:
        """Called just before a full read: the events queued so far are in it."""
        with self._lock:
            self._stale, self._pending = False, []
            self.resync_s = RESYNC_S * random.uniform(0.8, 1.2)

    def take(self) -> list[Any]:
        """The events queued since the last call (or read), oldest first."""
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def invalidate(self) -> None:
        """Read again next round (after a fence, a new session, a failed read)."""
        with self._lock:
            self._stale = True

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
            self._stale, self._pending = True, []
        if watch_id is not None and coord is not None:
            self._cancel(coord, watch_id)

    def _cancel(self, coord: Watchable, watch_id: int) -> None:
        try:
            coord.cancel_watch(watch_id)
        except Exception as e:  # the stream may be gone with its connection already
            self.log.debug("etcd_watch_cancel_failed", error=str(e))

    def _on_response(self, generation: int, response: Any) -> None:
        """On pyetcd's watch thread: a batch of events, or an error / None when the
        stream ended (a compacted revision arrives as an error too)."""
        events = getattr(response, "events", None)
        with self._lock:
            if generation != self._generation:
                return
            if events is None:  # the stream ended: read every round until re-armed
                self._watch_id, self._stale, self._pending = None, True, []
                self._generation += 1
            elif not events:
                return  # a progress notification
            else:
                self._pending.extend(events)
                if all(isinstance(e, PutEvent) and e.key == self.own_key for e in events):
                    return  # only our own record: applied next round, nothing to wake for
                self.changes += 1
        self.wake()
