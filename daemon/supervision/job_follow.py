"""The daemon's view of its job, followed through etcd's watch: one read, then events.

:class:`JobFollower` joins the watch (``daemon.coordination.job_watch``) and the cached
copy (``daemon.coordination.job_cache``) for the upkeep: :meth:`JobFollower.load` reads
the whole job (one range request) and arms the watch at the revision after it;
:meth:`JobFollower.changed` applies the events queued since, with no request. Which of
the two a round needs is :meth:`JobFollower.due`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from daemon.coordination import Coordinator, JobCache, JobView, JobWatch


class JobFollower:
    def __init__(self, coord: Coordinator, node_id: str, wake: Callable[[], None] | None) -> None:
        self.coord = coord
        self.watch = JobWatch(f"{coord.prefix}nodes/{node_id}", wake)
        self.cache = JobCache(coord.prefix)
        self.loaded_at = 0.0  # when the job was last read whole (monotonic)
        self.reads = 0  # whole reads (tests and the bench count them)

    def due(self) -> bool:
        """Whether this round must read the whole job rather than apply events."""
        return self.watch.due(time.monotonic() - self.loaded_at)

    def load(self) -> JobView:
        """Read the whole job and watch from the revision after it; raises the
        coordinator's errors (the watch is then left to be armed by the next read)."""
        self.watch.reading()
        kvs, revision = self.coord.read_job()
        self.reads += 1
        job = self.cache.load(kvs, revision)
        self.loaded_at = time.monotonic()
        self.watch.arm(self.coord, revision + 1)
        return job

    def changed(self) -> JobView | None:
        """The view with the queued events applied, or None when none changed it."""
        return self.cache.view() if self.cache.apply(self.watch.take()) else None

    def distrust(self, reachable: bool) -> None:
        """A read failed: stop the watch (cancelled if etcd is `reachable`), read next round."""
        self.watch.disarm(self.coord if reachable else None)

    def refence(self) -> None:
        """After a fence the stream may have gone quiet: read whole next round."""
        self.watch.disarm(self.coord)

    def invalidate(self) -> None:
        self.watch.invalidate()

    def close(self) -> None:
        self.watch.disarm()
