"""Telling this node's ranks at once (``PHALANX_NOTICE``, read by ``trainer.ft.notice``).

A rank abandons the step it waits on rather than wait out ``ft.timeout_s`` when

* the published lighthouse moved (a new leader): every rank abandons;
* the leader announced members of a quorum its lighthouse lost (``lost``: a host gone
  without a reset, ``daemon.leadership.lighthouse_status``), or a node announced that its
  own group's ranks failed in a quorum (``failed/<gid>``: a rank killed, crashed or hung,
  ``daemon.ranks.failure_notice``): a rank abandons only while its own quorum is
  that one, and has one of them. A replacement that took a lost member's replica id is
  in a later quorum (its first is numbered anew), so a collective with it is never
  abandoned for the member it replaced.

Each is one more notice; the file holds the last :data:`KEPT`, so a rank that reads it
late still sees a move behind a later announcement. Written atomically to
``<run_dir>/notice.json`` and logged as ``ranks_told``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer import logs
from trainer.contracts import notice_file
from trainer.contracts.notice_file import Told

KEPT = 8  # notices the file holds: a rank polls every 50 ms, the daemon tells a few a round
_UNSEEN = object()  # no view of the job yet


class RankNotice:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # a notice is news to this daemon's ranks only
        self._seq = 0
        self._kept: list[Told] = []
        self._lost_seen: Any = _UNSEEN  # the leader's last ``lost`` announcement seen
        self._failed_seen: Any = _UNSEEN  # the ``failed/<gid>`` announcements seen

    def tell(
        self,
        lighthouse: str,
        reason: str,
        quorum_id: int | None = None,
        replicas: tuple[str, ...] = (),
    ) -> None:
        """One more notice; `quorum_id` and `replicas` for members lost from a quorum."""
        self._seq += 1
        notice = Told(self._seq, lighthouse, reason, quorum_id, replicas)
        self._kept = [*self._kept, notice][-KEPT:]
        notice_file.write(self.path, self._kept)
        logs.get().info("ranks_told", **notice.fields())

    def follow_lost(self, lost: Any, lighthouse: str | None) -> None:
        """The leader's ``lost`` key as the view shows it: a new announcement by the
        lighthouse published now is told; what was announced before this daemon's first
        view is not news, and one by a lighthouse since replaced concerns no quorum."""
        seen, self._lost_seen = self._lost_seen, lost
        if lost == seen or seen is _UNSEEN:
            return
        self._tell_members(lost, lighthouse, "the lighthouse lost {} from quorum {}")

    def follow_failed(self, failed: dict[int, Any], lighthouse: str | None) -> None:
        """The nodes' ``failed/<gid>`` announcements as the view shows them: each that is
        new since this daemon's first view, by the lighthouse published now, is told."""
        seen, self._failed_seen = self._failed_seen, dict(failed)
        if seen is _UNSEEN:
            return
        for gid, value in sorted(failed.items()):
            if value != seen.get(gid):
                self._tell_members(value, lighthouse, "{} failed in quorum {}")

    def _tell_members(self, said: Any, lighthouse: str | None, reason: str) -> None:
        """Tell members lost from a quorum: `said` holds ``replicas``, ``quorum_id`` and the
        ``lighthouse`` that numbered it; one by a lighthouse since replaced concerns no
        quorum (ids start from 1 again under a new one)."""
        if not isinstance(said, dict) or not lighthouse or said.get("lighthouse") != lighthouse:
            return
        replicas, quorum_id = said.get("replicas"), said.get("quorum_id")
        if not isinstance(quorum_id, int) or not isinstance(replicas, list) or not replicas:
            return
        named = [str(r) for r in replicas]
        self.tell(
            lighthouse,
            reason.format(", ".join(named), quorum_id),
            quorum_id=quorum_id,
            replicas=tuple(named),
        )
