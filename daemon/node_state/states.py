"""The supervisor's states and the transitions allowed between them.

:data:`TRANSITIONS` is the one statement of the daemon's life cycle. The
supervisor refuses (raises :class:`IllegalTransition`) any move not listed, and
its docstring carries :func:`diagram`, which a test keeps equal to this table.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    JOINING = "joining"  # reach etcd, open a session, check the job spec, register
    CLAIMING = "claiming"  # claim a replica-group slot (the previous one first)
    WAITING = "waiting"  # a lighthouse address and job.min_replicas groups before starting
    RUNNING = "running"  # the ranks run; watch for exit, hang, lost slot, job completion
    FENCED = "fenced"  # lease unconfirmed: ranks paused until etcd says what they may keep
    STOPPING = "stopping"  # the ranks are being stopped (SIGTERM, SIGKILL at a deadline)
    RESTARTING = "restarting"  # backoff within the restart budget
    DRAINING = "draining"  # SIGTERM: the ranks leave the quorum, the slot is released
    DONE = "done"  # exit 0
    FAILED = "failed"  # exit 1 (or 2 for bad input)


TERMINAL = frozenset({State.DONE, State.FAILED})

# Every state may also move to DRAINING (SIGTERM) except DRAINING, DONE and FAILED.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.JOINING: frozenset({State.CLAIMING, State.FAILED}),
    State.CLAIMING: frozenset({State.WAITING, State.DONE}),
    State.WAITING: frozenset({State.RUNNING, State.CLAIMING, State.DONE, State.FAILED}),
    State.RUNNING: frozenset({State.STOPPING, State.FENCED, State.DONE}),
    State.FENCED: frozenset({State.RUNNING, State.STOPPING}),
    State.STOPPING: frozenset(
        {State.RESTARTING, State.WAITING, State.CLAIMING, State.DONE, State.FAILED}
    ),
    State.RESTARTING: frozenset({State.WAITING, State.CLAIMING, State.DONE}),
    State.DRAINING: frozenset({State.DONE}),
    State.DONE: frozenset(),
    State.FAILED: frozenset(),
}
for _state in State:
    if _state not in TERMINAL and _state != State.DRAINING:
        TRANSITIONS[_state] = TRANSITIONS[_state] | {State.DRAINING}


class IllegalTransition(RuntimeError):
    """A handler asked for a move the table does not allow: a bug in the supervisor."""


def allowed(frm: State, to: State) -> bool:
    return to == frm or to in TRANSITIONS[frm]


def diagram() -> str:
    """The table as text, one line per state, in the order of :class:`State`."""
    width = max(len(s.name) for s in State)
    lines = []
    for state in State:
        targets = [t.name for t in State if t in TRANSITIONS[state]]
        lines.append(f"{state.name:<{width}} -> {' | '.join(targets) or '(exit)'}")
    return "\n".join(lines)
