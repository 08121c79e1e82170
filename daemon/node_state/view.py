"""What the supervisor and its ranks know of the node: its state, its group's progress."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from daemon.health import HealthReport
from daemon.node_state.states import State
from trainer.contracts import rank_events as events

__all__ = ["NodeView", "State"]


@dataclass
class NodeView:
    """The supervisor's state and what the ranks' events say, copied each tick into the
    published status (node_state/status.py) that /status, the metrics and the node's etcd
    record read.

    Two writers: the supervisor (``supervision/supervisor.py``) and the rank output
    threads through :meth:`track` (under :attr:`lock`); ``tests/unit/test_node_view_writers.py``
    holds the code to it. No other part sees it: the etcd upkeep is handed an
    :class:`~daemon.node_state.reports.UpkeepInput` and reports an ``UpkeepReport``, the
    node group reports a ``RanksReport``, the health monitor a ``HealthReport``.
    """

    # The supervisor's.
    state: State = State.JOINING
    registered: bool = False
    restarts: dict[str, int] = field(default_factory=dict)
    failure: str | None = None  # why the daemon failed (its exit 1 or 2)
    last_tick: float = field(default_factory=time.monotonic)
    ticks: int = 0  # supervisor loop iterations: /status shows the loop is alive
    waiting_for: str | None = None  # what WAITING (or a holding FENCED) waits for
    completed_seen_at: float | None = None  # when the job was first seen completed
    generation: int | None = None  # the spanning group's generation the ranks run under
    health: HealthReport | None = None  # the health monitor's last report (daemon.health)
    # The job's reached step as etcd recorded it when this node's ranks last started (the
    # upkeep's answer): a start-over is seen after a restart of every node too.
    reached: int = 0
    # The rank output threads' (track).
    step: int = 0
    loss: float | None = None
    participants: int | None = None
    largest_quorum: int = 0  # the most groups in any quorum this node's group committed in
    committed_steps: int = 0  # steps this node's group committed (every attempt's ranks)
    heals: int = 0
    started_over: int = 0  # times this node's group committed step 1 again (no state)
    started_over_from: int = 0  # the step the job had reached before the last of them
    last_heal_s: float | None = None
    rank_error: str | None = None  # the ranks' last rank_failed or bad_input error
    stragglers: dict[int, float] = field(default_factory=dict)  # rank -> ratio, while flagged
    train_done: dict[str, Any] | None = None
    latest_checkpoint: dict[str, Any] | None = None  # from a rank's checkpoint_saved
    invalid_checkpoints: set[str] = field(default_factory=set)  # paths our ranks refused to load
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def last_error(self) -> str | None:
        """The daemon's failure, else the ranks' last error."""
        return self.failure or self.rank_error

    @property
    def healthy(self) -> bool:
        """The last health report found nothing wrong (False before the first)."""
        return self.health is not None and self.health.ok

    def track(self, event: dict[str, Any], node_id: str) -> int | None:
        """Fold one rank event into the view (called from the rank output threads). Returns
        the step this node's group had reached when a step 1 is committed after it: the
        job started over from step 0 (no checkpoint to load, no peer with state to heal
        from), its committed steps since then lost; None otherwise."""
        name = event.get("event")
        started_over_from = None
        with self.lock:
            if name in (events.TRAIN_STEP, events.STEP_ITEMS):  # a committed step, logged or not
                self.committed_steps += 1
                joined = event.get("participants")
                if isinstance(joined, int):
                    self.largest_quorum = max(self.largest_quorum, joined)
            if name == events.TRAIN_STEP:
                step = int(event.get("step", self.step))
                # Before this daemon saw any step (it restarted): what etcd recorded.
                before = self.step or self.reached
                started_over_from = before if step == 1 and before > 1 else None
                if started_over_from is not None:
                    self.started_over += 1
                    self.started_over_from = started_over_from
                self.step = step
                self.loss = event.get("loss")
                self.participants = event.get("participants")
            elif name == events.STEP_ITEMS:  # a step train.log_every leaves out (never step 1)
                self.step = int(event.get("step", self.step))
                self.participants = event.get("participants")
            elif name == events.HEAL_DONE:
                self.heals += 1
                self.last_heal_s = event.get("seconds")
                self.step = int(event.get("step", self.step))
            elif name == events.TRAIN_DONE:
                self.train_done = dict(event)
                self.step = int(event.get("step", self.step))
            elif name == events.CHECKPOINT_INVALID:
                self.invalid_checkpoints = {*self.invalid_checkpoints, str(event.get("path"))}
            elif name == events.CHECKPOINT_SAVED:
                self.invalid_checkpoints = self.invalid_checkpoints - {str(event.get("path"))}
                self.latest_checkpoint = {
                    "step": event.get("step"),
                    "path": event.get("path"),
                    "time": event.get("time"),
                    "node": node_id,
                }
            elif name in (events.RANK_FAILED, events.BAD_INPUT):
                self.rank_error = str(event.get("error"))
            elif name in (events.STRAGGLER, events.STRAGGLER_CLEARED):
                rank, ratio = event.get("rank"), event.get("ratio")
                if isinstance(rank, int) and name == events.STRAGGLER:
                    self.stragglers[rank] = float(ratio) if isinstance(ratio, int | float) else 0.0
                elif isinstance(rank, int):
                    self.stragglers.pop(rank, None)
        return started_over_from

    def completed_for(self, now: float, completed: bool) -> float:
        """How long the job has been seen completed (by another node; 0 when it is not):
        `completed`, as the upkeep's last report shows the job."""
        if not completed:
            return 0.0
        self.completed_seen_at = self.completed_seen_at or now
        return now - self.completed_seen_at

    def unreplicated(self, most_groups: int) -> dict[str, int] | None:
        """The numbers of a run in which other groups held slots (at most `most_groups` at
        once, as the upkeep read them) but this node's group never shared a quorum with
        any of them (it trained alone, or not at all); None otherwise."""
        if most_groups <= 1 or self.largest_quorum > 1:
            return None
        return {
            "groups_holding_slots": most_groups,
            "largest_quorum": self.largest_quorum,
            "committed_steps": self.committed_steps,
        }
