"""Telling this node's ranks at once (``PHALANX_NOTICE``, read by ``trainer.ft.notice``).

Two things make a rank abandon the step it waits on rather than wait out
``ft.timeout_s``: the published lighthouse moved (a new leader), and the leader
announced quorum members its lighthouse lost (``lost``: a host gone without a reset,
``daemon.leadership.lighthouse_status``). Each is one more notice, written atomically
to ``<run_dir>/notice.json`` and logged as ``ranks_told``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from daemon.supervision.lease_file import write_notice
from trainer import logs

_UNSEEN = object()  # no view of the job yet


class RankNotice:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # a notice is news to this daemon's ranks only
        self._seq = 0
        self._lost_seen: Any = _UNSEEN  # the leader's last ``lost`` announcement seen

    def tell(self, lighthouse: str, reason: str) -> None:
        self._seq += 1
        write_notice(self.path, self._seq, lighthouse, reason)
        logs.get().info("ranks_told", lighthouse=lighthouse, seq=self._seq, reason=reason)

    def follow_lost(self, lost: Any, lighthouse: str | None) -> None:
        """The leader's ``lost`` key as the view shows it: a change is told to the ranks;
        what was announced before this daemon's first view is not news."""
        seen, self._lost_seen = self._lost_seen, lost
        if lost == seen or seen is _UNSEEN or not isinstance(lost, dict) or not lighthouse:
            return
        replicas = lost.get("replicas")
        named = ", ".join(map(str, replicas)) if isinstance(replicas, list) else "?"
        self.tell(lighthouse, f"the lighthouse lost {named}")
