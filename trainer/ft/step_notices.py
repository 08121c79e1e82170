"""What one rank's torchft group makes of its daemon's notices (:mod:`trainer.ft.notice`).

A notice concerns the rank when it says the lighthouse moved (every rank), or names
members lost from the quorum the rank is in now (``quorum_members_lost``): a killed
rank's replacement keeps its replica id, but its first quorum is numbered anew, so a
collective with it is never abandoned for the member it replaced. The group then
abandons the collective it waits on (:meth:`StepNotices.wait`), or, on torchft's quorum
thread, gives up building the process group for that quorum
(:meth:`StepNotices.build_watch`, for ``torchft_adapter.scoped_process_group``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer import logs
from trainer.ft.notice import Notice, StepWaits, Told

# This rank's last quorum: its id and its members' replica ids, None before any.
Members = Callable[[], tuple[int, Sequence[str]] | None]


class StepNotices:
    def __init__(self, path: Path | None, quorum: Members) -> None:
        self.notice = Notice(path)
        self._quorum = quorum
        self.waits = StepWaits(self.notice, self.concerns)  # this step's collectives
        self.log = logs.get()

    def concerns(self, told: Told) -> bool:
        """A move concerns every rank; members lost only a rank whose last quorum is the one
        they were lost from and holds one of them."""
        if told.moved:
            return True
        quorum = self._quorum()
        return (
            quorum is not None
            and quorum[0] == told.quorum_id
            and not set(told.replicas).isdisjoint(quorum[1])
        )

    def between_steps(self) -> None:
        """A new step: nothing of it is abandoned yet; a notice now is only logged (the
        step's quorum is asked for next, of the lighthouse the forwarder points at)."""
        self.waits.new_step()
        told = self.notice.changed(self.concerns)
        if told is not None:
            self.told(told, abandoned=False)

    def wait(self, work: Any, pending: Any) -> tuple[bool, Told | None]:
        """(True, None) once `work` is done. (False, the notice) when a notice abandons the
        step now, for the caller to act on; (False, None) for each later collective of a
        step already abandoned."""
        already = self.waits.told is not None
        told = self.waits.wait(work, pending)
        if told is None:
            return True, None
        return False, None if already else told

    def build_watch(self) -> Callable[[], str | None]:
        """For the quorum thread, as gloo connects to the members of the quorum it just
        got: a check naming why to give up, when a member of that quorum was announced
        lost (before or during the build) or the lighthouse moved since it began."""
        since = self.notice.newest_seq()

        def interrupted() -> str | None:
            for told in self.notice.entries():
                if (told.seq > since or not told.moved) and self.concerns(told):
                    self.log.warning("configure_abandoned", reason=told.reason)
                    return told.reason
            return None

        return interrupted

    def told(self, told: Told, **fields: Any) -> None:
        event = "lighthouse_moved" if told.moved else "quorum_members_lost"
        log = self.log.warning if fields.get("abandoned") else self.log.info
        log(event, lighthouse=told.lighthouse, reason=told.reason, **fields)
