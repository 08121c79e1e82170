"""Hot-spare ranks: one pre-started rank process per local rank, waiting for a start.

A standby is ``python -m trainer --standby``: it imports torch, torchft and the
trainer (about 2 s of a rank's 3 s start here), says ``standby_ready`` and blocks on
its stdin. A group start hands local rank r to standby r by writing the start's
environment to it as one JSON line; from then on it is that rank, its output relayed
like any rank's. The pool refills in the background, by forking a standby from the
node's zygote (daemon/ranks/zygote.py: warm at once, almost no CPU) once that is warm.
Before that, or where no zygote can be had, standbys are spawned; a node starts its
zygote once its first standbys are ready (see :meth:`StandbyPool.fill`). Where they warm at
idle priority (SCHED_IDLE and a session group at nice 19, see trainer/spares/scheduling.py)
a new one is spawned at once: its imports then take mostly the CPU the ranks leave;
one handed a start while it still warms is lifted to normal priority from here.
Where they would warm at normal priority, it is spawned once the group that took the
last one has had :data:`REFILL_DELAY_S` to start (so the imports do not compete with
the heal), or at once when no group runs.

Failure handling: a standby that exits before it is used is reaped and replaced; if
standbys keep dying young (:data:`MAX_EARLY_DEATHS` in a row before ever being ready),
the pool stops spawning them and the node starts ranks cold, as with
``node.standby = false``. A standby that dies just as it is handed a start is not
used (the rank is spawned cold instead). Draining and every ending kill the pool; the
kernel kills standbys with the daemon (PR_SET_PDEATHSIG), like ranks.
"""

from __future__ import annotations

import threading
from typing import Any

from daemon.children import kill_tree
from daemon.ranks.rank_process import Output, RankEvent, Watched, spawn
from daemon.ranks.spec import RANK_ARGV, GroupSpec, rank_env
from daemon.ranks.zygote import MAX_ZYGOTE_DEATHS, Zygote
from trainer import logs
from trainer.contracts import rank_events as events
from trainer.contracts import spare_messages
from trainer.spares.scheduling import leave_idle

# After a group start, before spawning the standbys it used up, where standbys warm at
# normal priority (trainer/spares/scheduling.py); at idle priority they are spawned at once.
REFILL_DELAY_S = 5.0
MAX_EARLY_DEATHS = 3  # standbys in a row that die before ready: stop spawning them


class Standby(Watched):
    """One waiting rank process."""

    def __init__(
        self,
        rank: int,
        spec: GroupSpec,
        sink: RankEvent,
        wake: threading.Event | None,
        zygote: Zygote | None = None,
    ) -> None:
        self.rank = rank
        self.sink = sink  # where its events go while it waits (the node's, like a rank's)
        self.ready = threading.Event()
        self.metrics_dir = spec.metrics_dir
        argv = [*RANK_ARGV, "--standby", "--config", str(spec.config_path)]
        # Import-time settings (threads, PYTHONPATH, the metrics directory) are the
        # start's; the start's own values (store port, attempt) come with the assignment.
        env = rank_env(spec, rank, 0, 0)
        forked = zygote.fork(env) if zygote is not None else None
        self.forked = forked is not None  # from the zygote, warm: else spawned
        self.popen = forked or spawn(argv, env, stdin_pipe=True)
        self.output = Output(self.popen, rank, None, self._relay, wake)

    def _relay(self, rank: int, event: dict[str, Any]) -> None:
        if event.get("event") == events.STANDBY_READY:
            self.ready.set()
        event.setdefault("standby", True)
        self.sink(rank, event)

    def assign(self, env: dict[str, str], slot: int, sink: RankEvent) -> bool:
        """Hand this standby a start: False if it is gone (the caller spawns the rank cold)."""
        if not self.alive():
            return False
        self.output.group, self.output.sink = slot, sink
        stdin = self.popen.stdin
        assert stdin is not None
        try:
            stdin.write(spare_messages.start(env) + b"\n")
            stdin.close()
        except OSError:  # it died in the meantime
            self.kill()
            return False
        # Lift it from here: if it still warms at idle priority, it may not get to run
        # the thread that would lift it for a long time (trainer/spares/scheduling.py).
        leave_idle(self.pid)
        return True

    def kill(self) -> None:
        kill_tree([self.pid])
        self.output.reap(self.metrics_dir)


class StandbyPool:
    """At most one standby per local rank of this node's group."""

    def __init__(self, nproc: int, sink: RankEvent, wake: threading.Event | None = None) -> None:
        self.nproc = nproc
        self.sink = sink
        self.wake = wake
        self.slots: list[Standby | None] = [None] * nproc
        self.early_deaths = 0
        self.disabled = False
        self.zygote: Zygote | None = None
        self.zygote_deaths = 0  # in a row, before ready
        self.log = logs.get()

    @property
    def forks(self) -> bool:
        """Whether a refill is forked from a warm zygote (costs the ranks nothing)."""
        return self.zygote is not None and self.zygote.ready.is_set() and self.zygote.alive()

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.slots if s is not None]

    def take(self) -> list[Standby | None]:
        """Every live standby, one per local rank (None where there is none); the pool is
        left empty."""
        self.reap()
        taken, self.slots = self.slots, [None] * self.nproc
        return taken

    def reap(self) -> None:
        """Forget standbys that exited; too many dying before they were ever ready stops
        the pool (ranks then start cold)."""
        for i, s in enumerate(self.slots):
            if s is None or s.alive():
                continue
            code = s.popen.poll()
            s.kill()  # reaps, and drops its metrics files
            self.slots[i] = None
            self.early_deaths = 0 if s.ready.is_set() else self.early_deaths + 1
            self.log.warning("standby_exited", rank=i, pid=s.pid, code=code, ready=s.ready.is_set())
            if self.early_deaths >= MAX_EARLY_DEATHS and not self.disabled:
                self.disabled = True
                self.log.error(
                    "standby_disabled",
                    reason=f"{self.early_deaths} standbys in a row exited before they were ready; "
                    "ranks start cold from now on (see their rank_output lines)",
                )

    def fill(self, spec: GroupSpec) -> None:
        """Start a standby for every local rank that has none (from the supervisor's
        thread): forked from the zygote once it is warm, spawned until then.

        A node's first standbys are spawned, and its zygote is started once they are
        ready: a start in the node's first minute (the zygote's warm-up, next to busy
        ranks) then takes a standby that is warm, or half warm, instead of starting its
        ranks cold; and the zygote does not share the idle CPU with them."""
        self.reap()
        if self.disabled:
            return
        settled = all(s is not None and s.ready.is_set() for s in self.slots)
        zygote = self._tend_zygote(spec) if self.zygote is not None or settled else None
        warm = zygote if zygote is not None and zygote.ready.is_set() else None
        for i, s in enumerate(self.slots):
            if s is None:
                standby = Standby(i, spec, self.sink, self.wake, warm)
                self.slots[i] = standby
                self.log.info("standby_spawned", rank=i, pid=standby.pid, forked=standby.forked)

    def _tend_zygote(self, spec: GroupSpec) -> Zygote | None:
        """The zygote (warm or still warming), None where there is none to be had; one
        that exited is replaced unless too many in a row died before they were warm."""
        z = self.zygote
        if z is not None and not z.alive():
            code = z.popen.poll()
            z.kill()
            self.zygote = None
            self.zygote_deaths = 0 if z.ready.is_set() else self.zygote_deaths + 1
            if code == 0 and not z.ready.is_set():  # it refused to fork (standby_zygote_refused)
                self.zygote_deaths = MAX_ZYGOTE_DEATHS
            self.log.warning("standby_zygote_exited", pid=z.pid, code=code, ready=z.ready.is_set())
        if self.zygote is None and self.zygote_deaths < MAX_ZYGOTE_DEATHS:
            self.zygote = Zygote(spec, self.sink, self.wake)
            self.log.info("standby_zygote_spawned", pid=self.zygote.pid)
        return self.zygote

    def kill(self) -> None:
        for i, s in enumerate(self.slots):
            if s is not None:
                s.kill()
                self.slots[i] = None
        if self.zygote is not None:
            self.zygote.kill()
            self.zygote = None
