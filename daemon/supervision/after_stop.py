"""What follows a stopped group: the one decision STOPPING makes, as a pure function.

The supervisor stops its group for a reason (a rank exit, a hang, a lost slot, the
job completing elsewhere) and, once every rank is gone, asks :func:`after_stop`
where to go. Keeping the decision here, free of processes and etcd, lets a unit
test walk every branch; ``tests/unit/test_supervisor_states.py`` reads the states
returned below as STOPPING's moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from daemon.node_state.states import State
from daemon.ranks.stop_cause import (
    FENCED_OUT,
    SLOT_LOST,
    FencedOut,
    GroupRestart,
    JobEnded,
    NoState,
    SlotLost,
    StopCause,
    Unhealthy,
)
from daemon.ranks.workers import ExitKind
from daemon.supervision.restarts import RestartBudget

__all__ = ["FENCED_OUT", "SLOT_LOST", "StopDecision", "after_stop"]


@dataclass(frozen=True)
class StopDecision:
    state: State
    reason: str = ""  # RESTARTING/WAITING: hang, rank_exit, peers, fenced or group; DONE: why
    detail: str = ""  # what the ranks said, for the log
    error: str = ""  # FAILED: the message for the log, /status and the job state
    code: int = EXIT_OK  # FAILED: the daemon's exit code
    delay_s: float = 0.0  # RESTARTING: the backoff before the next start

    def note(self) -> dict[str, object]:
        """A restart's fields for the state_changed event."""
        return {"reason": self.reason, "detail": self.detail, "delay_s": round(self.delay_s, 2)}


def after_stop(
    cause: StopCause,
    *,
    slot_held: bool,
    missing_groups: str | None,
    budget: RestartBudget,
    now: float,
    last_error: str | None,
    spanning: bool = False,
) -> StopDecision:
    """Where a node goes once its group has stopped for `cause` (an exit or a reason).
    `spanning`: the group spans nodes (job.nodes_per_group > 1)."""
    if isinstance(cause, SlotLost):
        return StopDecision(State.WAITING if slot_held else State.CLAIMING)
    if isinstance(cause, FencedOut):  # a restart the node did not cause: outside the budget
        return StopDecision(State.WAITING if slot_held else State.CLAIMING, reason="fenced")
    if isinstance(cause, GroupRestart):  # another node's failure: outside our budget
        return StopDecision(
            State.WAITING if slot_held else State.CLAIMING, reason="group", detail=cause.reason
        )
    if isinstance(cause, Unhealthy):  # not a crash: WAITING gives the seat back
        return StopDecision(State.WAITING if slot_held else State.CLAIMING, detail=cause.reason)
    if isinstance(cause, JobEnded):  # the job completed elsewhere
        return StopDecision(State.DONE, reason=cause.reason)
    if isinstance(cause, NoState):  # the user would rather stop than retrain
        return StopDecision(State.FAILED, error=cause.reason, code=EXIT_FAILED)
    if cause.kind == ExitKind.DRAINED and spanning:  # the group agreed to stop after a
        # step because another of its nodes drains: this part waits for a node to take
        # that one's seat (it gives it back as it leaves)
        detail = "another node of the group drained"
        return StopDecision(State.WAITING if slot_held else State.CLAIMING, "group", detail)
    if cause.kind == ExitKind.DRAINED:  # a rank was told to stop by someone else
        error = "ranks were stopped from outside the daemon"
        return StopDecision(State.FAILED, error=error, code=EXIT_FAILED)
    if cause.kind == ExitKind.BAD_INPUT:
        return StopDecision(State.FAILED, error=last_error or cause.reason, code=EXIT_BAD_INPUT)
    # Not a crash: the ranks timed out waiting for peers that are gone, or that hold a
    # slot but whose ranks did not join the quorum in ft.quorum_timeout_s (still starting).
    if missing_groups or cause.kind == ExitKind.NO_QUORUM:
        return StopDecision(State.WAITING, reason="peers", detail=cause.reason)
    if not budget.allows(now):
        error = (
            f"gave up after {budget.max_restarts} restarts in {budget.window_s:.0f}s; "
            f"last error: {last_error or cause.reason}"
        )
        return StopDecision(State.FAILED, error=error, code=EXIT_FAILED)
    reason = "hang" if cause.kind == ExitKind.HUNG else "rank_exit"
    delay = budget.record(now)
    return StopDecision(State.RESTARTING, reason=reason, detail=cause.reason, delay_s=delay)
