"""Partition safety for one node's ranks (rules.py), as state the
upkeep owns: fenced while etcd has not confirmed our lease; a lost lease (a new
session replaced it) judged once etcd answers, by :func:`after_fence`, as KEEP the
paused ranks' state or DISCARD it; and the leader epoch the ranks train under, which
that judgement and the node's record need.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from daemon.coordination.job_view import JobView
from daemon.fencing.rules import Fence, after_fence, job_moved_on
from trainer import logs


@dataclass
class FenceJudge:
    node_id: str
    fenced: bool = False  # the lease is unconfirmed: nothing may commit here
    lease_lost: bool = False  # a new session replaced the one we were fenced with
    answered_at: float = 0.0  # when etcd answered again after the fence
    trained_epoch: int | None = None  # the leader epoch our ranks train under
    epoch_step: int = 0  # our step when they began to
    doubt: str | None = None  # why our running ranks may hold steps no survivor has
    gap_s: float = 0.0  # the longest time etcd did not confirm our lease, since the last
    # view of the job (see out_of_touch, follow_epoch)

    def must_pause(self) -> bool:
        """Nothing may commit here now: fenced, a lost lease not judged yet, or a doubt."""
        return self.fenced or self.lease_lost or self.doubt is not None

    def distrust(self, why: str, step: int) -> None:
        """Our ranks may have committed steps the job's leader never saw (we led on, or
        trained on under the old leader, while another node took over): they restart
        and heal from the survivors (``verdict`` discards them)."""
        if self.doubt is None:
            logs.get().warning("epoch_doubt", reason=why, step=step)
        self.doubt = why

    def out_of_touch(self, gap_s: float) -> None:
        """etcd confirmed our lease again after `gap_s` without (measured from the last
        confirmation's send time to this one's)."""
        self.gap_s = max(self.gap_s, gap_s)

    def fence(self, step: int) -> None:
        self.fenced = True
        logs.get().warning("fenced", reason="etcd lease unconfirmed", step=step)

    def renewed(self) -> None:
        """A new session: our ranks are judged once etcd has our new keys."""
        self.lease_lost = True

    def answered(self) -> None:
        """etcd confirmed a lease (ours kept, or a new one) after the fence."""
        self.fenced, self.answered_at = False, time.monotonic()
        logs.get().info("unfenced", lease="new" if self.lease_lost else "kept")

    def ranks_started(self) -> None:
        """Fresh ranks: nothing of theirs is left to judge, and they train under whichever
        epoch the view shows next (a gap before they started is no doubt about them)."""
        self.lease_lost, self.doubt = False, None
        self.trained_epoch, self.gap_s = None, 0.0

    def follow_epoch(self, epoch: int | None, running: bool, step: int, doubt_s: float) -> None:
        """While our ranks train (not fenced, no lost lease to judge), note the leader
        epoch they train under and our step when it began. A new epoch seen after etcd
        was out of touch for longer than `doubt_s` (``fencing.epoch_doubt_s``) is a
        doubt: a new leader may have been elected while our ranks trained on under the
        old one."""
        if self.lease_lost:
            return
        if epoch is None or epoch == self.trained_epoch:
            # The view, read whole after the gap (EtcdUpkeep._note_gap), shows no new
            # leader: one elected from now on is seen live, its lighthouse followed at once.
            self.gap_s = 0.0
            return
        if running and self.trained_epoch is not None and self.gap_s > doubt_s:
            self.distrust(
                f"a new leader (epoch {self.trained_epoch} -> {epoch}) was elected while etcd "
                f"did not confirm our lease for {self.gap_s:.1f} s",
                step,
            )
        self.gap_s = 0.0
        if running:
            self.trained_epoch, self.epoch_step = epoch, step

    def discard(self, step: int, why: str) -> tuple[Fence, str]:
        """DISCARD the paused ranks' state for `why` (the lost lease counts as judged)."""
        logs.get().warning("fence_discarding", reason=why, step=step)
        self.lease_lost = False
        return Fence.DISCARD, why

    def verdict(
        self,
        job: JobView | None,
        step: int,
        snapshot_at: float,
        shown: str | None,
        invalid: Collection[str] = (),
    ) -> tuple[Fence, str]:
        """What paused ranks may do: HOLD while fenced or undecided (`snapshot_at`: when the
        job was last read); KEEP or DISCARD once, logged, after which the lost lease
        counts as judged. A HOLD is logged when its reason differs from `shown`, the one
        the node shows now."""
        if self.fenced:
            return Fence.HOLD, "etcd has not confirmed our lease"
        if snapshot_at < self.answered_at:  # lease kept or not: the job may have ended
            return Fence.HOLD, "no view of the job since etcd answered"
        if self.doubt is not None:
            why, self.doubt = self.doubt, None
            return self.discard(step, why)
        verdict, why = Fence.KEEP, "the lease was kept: nothing changed hands"
        moved_on = job_moved_on(step, job.state, job.checkpoint, invalid) if job else None
        if moved_on is not None:
            verdict, why = Fence.DISCARD, moved_on
        elif self.lease_lost:
            epoch = job.leader_epoch if job else None
            verdict, why = after_fence(
                node_id=self.node_id,
                step=step,
                trained_epoch=self.trained_epoch,
                epoch=epoch,
                nodes=job.nodes if job else {},
                held_s=time.monotonic() - self.answered_at,
            )
            if verdict == Fence.KEEP:
                # The gap and the epoch it led to are judged: nobody committed under that
                # epoch. Doubted again when the view next showed it (follow_epoch), they
                # once restarted the ranks this judgement had just resumed.
                self.trained_epoch, self.epoch_step, self.gap_s = epoch, step, 0.0
        if verdict == Fence.HOLD:
            if why != shown:
                logs.get().info("fence_holding", reason=why, step=step)
            return verdict, why
        if verdict == Fence.DISCARD:
            logs.get().warning("fence_discarding", reason=why, step=step)
        self.lease_lost = False
        return verdict, why
