"""Telling this node's ranks at once (``PHALANX_NOTICE``, read by ``trainer.ft.notice``).

A rank abandons the step it waits on rather than wait out ``ft.timeout_s`` when the
published lighthouse moved (a new leader). Each move is one more notice, written
atomically to ``<run_dir>/notice.json`` and logged as ``ranks_told``. The leader's
``lost`` announcements (``daemon.leadership.lighthouse_status``) are not told to the
ranks: a replacement that took the lost replica's id raced them (DESIGN.md).
"""

from __future__ import annotations

from pathlib import Path

from daemon.supervision.lease_file import write_notice
from trainer import logs


class RankNotice:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # a notice is news to this daemon's ranks only
        self._seq = 0

    def tell(self, lighthouse: str, reason: str) -> None:
        self._seq += 1
        write_notice(self.path, self._seq, lighthouse, reason)
        logs.get().info("ranks_told", lighthouse=lighthouse, seq=self._seq, reason=reason)
