"""The daemon's copy of its job: one range read, then kept current by the watch's events.

A daemon used to read the whole job prefix again whenever any other node wrote
anything, and every node wrote every 2 s: at N nodes each daemon read N records N/2
times a second. Now :class:`JobCache` is loaded once from a range read (``load``), and
each event the watch delivers (``daemon.coordination.job_watch``) updates the one key it
names (``apply``); the job is read again only when the watch cannot be trusted (it
broke, etcd compacted the revision it needed, or the node was fenced) or after the
rare resync (``job_watch.RESYNC_S``).

Each key's JSON is parsed once, when it arrives; a :class:`JobView` is assembled only
after something changed. Events at or below the revision of the read the cache was
loaded from (delivered by a watch armed before a resync read) are skipped, so a key is
never set back to an older value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyetcd.events import DeleteEvent, PutEvent

from daemon.coordination.job_view import JobView, assemble, read_entry


class JobCache:
    """The job's keys as (value, create revision), by name below the job prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._entries: dict[str, tuple[Any, int]] = {}
        self.revision = 0  # etcd's revision the cache reflects
        self._read_at = 0  # the revision of the read it was loaded from
        self._view: JobView | None = None
        self.applied = 0  # events applied since the last load (tests and the bench count them)

    @property
    def loaded(self) -> bool:
        return self.revision > 0

    def load(self, kvs: Iterable[Any], revision: int) -> JobView:
        """Replace everything with one range read of the prefix at `revision`."""
        self._entries = {}
        for kv in kvs:
            self._put(kv)
        self.revision, self._read_at, self._view, self.applied = revision, revision, None, 0
        return self.view()

    def apply(self, events: Iterable[Any]) -> bool:
        """Apply watch events (PutEvent / DeleteEvent, oldest first); True if any changed
        the cache."""
        changed = False
        for event in events:
            revision = int(event.mod_revision)
            if revision <= self._read_at:
                continue  # already in the read the cache was loaded from (one revision
                # may hold several events: a revoked lease deletes all its keys at once)
            key = event.key.decode(errors="replace") if isinstance(event.key, bytes) else ""
            if not key.startswith(self.prefix):
                continue
            if isinstance(event, PutEvent):
                self._put(event)
            elif isinstance(event, DeleteEvent):
                name = key[len(self.prefix) :]
                self._entries.pop(name, None)
            else:
                continue
            self.revision, changed = revision, True
            self.applied += 1
        if changed:
            self._view = None
        return changed

    def view(self) -> JobView:
        if self._view is None:
            self._view = assemble(
                ((name, value, created) for name, (value, created) in self._entries.items()),
                self.revision,
            )
        return self._view

    def _put(self, kv: Any) -> None:
        entry = read_entry(self.prefix, kv)
        if entry is None:  # unreadable: not in the view (as a read would leave it out)
            raw = kv.key.decode(errors="replace") if isinstance(kv.key, bytes) else ""
            self._entries.pop(raw[len(self.prefix) :], None)
            return
        name, value = entry
        self._entries[name] = (value, int(kv.create_revision))
