"""The other nodes' progress, current enough to judge paused ranks after a lost lease.

``daemon.fencing.rules.after_fence`` asks whether the others went on without
this node: their steps against ours. Progress is written only every
``PROGRESS_EVERY_S`` (``daemon.coordination.progress``), so the node asks for it
first (one put every daemon watches), then reads the progress keys each round until
every running node has answered. A node that has not answered within ``ASK_WAIT_S``
(dead with its lease still running, or too loaded to answer) may have gone on without
us, so the ranks are then discarded (restarted to heal from the others), never kept
on steps that may be stale. One ask per lost lease; nothing is sent otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from daemon.coordination import Coordinator, JobView
from daemon.coordination.progress import ASK_WAIT_S, Progress, answered, with_steps
from daemon.fencing.judge import FenceJudge
from daemon.fencing.rules import Fence

__all__ = ["ASK_WAIT_S", "ProgressAsk"]

Attempt = Callable[[str, Callable[[], Any]], tuple[bool, Any]]


class ProgressAsk:
    def __init__(self, coord: Coordinator, attempt: Attempt) -> None:
        self.coord = coord
        self.attempt = attempt  # EtcdUpkeep._attempt: errors become state, not exceptions
        self._ask: tuple[int, float] | None = None  # (its revision, when it was put)

    def nodes(self, job: JobView) -> tuple[dict[str, dict[str, Any]], bool] | None:
        """The job's node records with the steps their progress holds, and whether every
        running node answered; None while the answers are awaited (or etcd is away): the
        ranks stay paused."""
        if self._ask is None:
            ok, revision = self.attempt("progress", self.coord.ask_progress)
            if not ok:
                return None
            self._ask = (int(revision), time.monotonic())
        ok, progress = self.attempt("progress", self.coord.read_progress)
        if not ok:
            return None
        found: dict[str, Progress] = progress
        revision, at = self._ask
        complete = answered(found, job.nodes, self.coord.node_id, revision)
        if not complete and time.monotonic() - at < ASK_WAIT_S:
            return None
        return with_steps(job.nodes, found), complete

    def done(self) -> None:
        """The lost lease is judged: the next one asks again."""
        self._ask = None

    def verdict(
        self,
        judge: FenceJudge,
        job: JobView | None,
        step: int,
        snapshot_at: float,
        shown: str | None,
        invalid: Collection[str] = (),
    ) -> tuple[Fence, str]:
        """What paused ranks at `step` may do (FenceJudge.verdict, which `shown` and
        `invalid` are handed to); after a lost lease, judged against the others' current
        steps, asked for here. `snapshot_at`: when `job` was read."""
        if judge.lease_lost and not judge.fenced and job and snapshot_at >= judge.answered_at:
            asked = self.nodes(job)
            if asked is None:
                return Fence.HOLD, "waiting for the other nodes' progress"
            if not asked[1]:
                self.done()
                why = f"not every running node answered within {ASK_WAIT_S:g} s"
                return judge.discard(step, f"{why}: they may have gone on without us")
            job = replace(job, nodes=asked[0])
        verdict = judge.verdict(job, step, snapshot_at, shown, invalid)
        if not judge.lease_lost:
            self.done()
        return verdict
