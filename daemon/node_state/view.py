"""What one daemon knows: its state, its slot, its group's progress (for /status, metrics, etcd)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from daemon.coordination.coordinator import JobView
from daemon.node_state.states import State

__all__ = ["NodeView", "State"]


@dataclass
class NodeView:
    """Written by the supervisor loop, and by the rank output threads through :meth:`track`."""

    state: State = State.JOINING
    slot: int | None = None
    leader: bool = False
    lighthouse: str | None = None
    etcd_up: bool = False
    etcd_errors: int = 0
    registered: bool = False
    step: int = 0
    loss: float | None = None
    participants: int | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    heals: int = 0
    last_heal_s: float | None = None
    pids: list[int] = field(default_factory=list)
    standby_pids: list[int] = field(default_factory=list)  # waiting standbys (daemon.ranks.standby)
    last_error: str | None = None
    train_done: dict[str, Any] | None = None
    checkpoint_to_publish: dict[str, Any] | None = None  # from a rank's checkpoint_saved
    job: JobView | None = None
    last_tick: float = field(default_factory=time.monotonic)
    ticks: int = 0  # supervisor loop iterations: /status shows the loop is alive
    waiting_for: str | None = None  # what WAITING waits for, None otherwise
    completed_seen_at: float | None = None  # when the job was first seen completed
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def slot_label(self) -> str:
        return "-" if self.slot is None else str(self.slot)

    def track(self, event: dict[str, Any], node_id: str) -> None:
        """Fold one rank event into the view (called from the rank output threads)."""
        name = event.get("event")
        with self.lock:
            if name == "train_step":
                self.step = int(event.get("step", self.step))
                self.loss = event.get("loss")
                self.participants = event.get("participants")
            elif name == "heal_done":
                self.heals += 1
                self.last_heal_s = event.get("seconds")
                self.step = int(event.get("step", self.step))
            elif name == "train_done":
                self.train_done = dict(event)
                self.step = int(event.get("step", self.step))
            elif name == "checkpoint_saved":
                self.checkpoint_to_publish = {
                    "step": event.get("step"),
                    "path": event.get("path"),
                    "time": event.get("time"),
                    "node": node_id,
                }
            elif name in ("rank_failed", "bad_input"):
                self.last_error = str(event.get("error"))

    @property
    def job_completed(self) -> bool:
        return bool(self.job and self.job.state and self.job.state.get("state") == "completed")

    def completed_for(self, now: float) -> float:
        """How long the job has been seen completed (by another node; 0 when it is not)."""
        if not self.job_completed:
            return 0.0
        self.completed_seen_at = self.completed_seen_at or now
        return now - self.completed_seen_at

    def missing_groups(self, need: int) -> str | None:
        """Whether fewer than `need` replica groups hold a slot (what is missing), or None."""
        have = len(self.job.groups) if self.job is not None else 0
        return None if have >= need else f"replica groups: {have} of job.min_replicas={need}"

    def take_checkpoint(self) -> dict[str, Any] | None:
        with self.lock:
            record, self.checkpoint_to_publish = self.checkpoint_to_publish, None
            return record

    def return_checkpoint(self, record: dict[str, Any]) -> None:
        """Publishing failed: keep the record for the next tick unless a newer one arrived."""
        with self.lock:
            self.checkpoint_to_publish = self.checkpoint_to_publish or record
