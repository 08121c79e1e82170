"""What a supervisor handler decides: the next state and the commands to carry out.

A handler (supervisor.py) reads the tick's reports and asks its parts questions whose
answers decide it (a claim, whether the ranks stopped, the fence's verdict); everything
it *does* to the world comes back as a :class:`Decision`: frozen commands, carried out
in order by :func:`carry_out` once the handler returned and before the state changes,
so a log line keeps its place among the effects. A unit test reads a handler's
decision without carrying it out (``tests/unit/test_supervisor_commands.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from daemon.coordination import JobView
from daemon.node_state.states import State
from daemon.ranks.spec import GroupPart
from daemon.ranks.stop_cause import StopCause
from daemon.supervision.parts import Parts


@dataclass(frozen=True)
class Say:
    """A log line: `level` is info, warning or error."""

    level: str
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StartRanks:
    slot: int
    lighthouse: str
    part: GroupPart | None
    reached: int | None  # the job's reached step as etcd had it (None: unread)
    restart: str | None  # why this start is a restart (None: the group's first)


@dataclass(frozen=True)
class StopRanks:
    cause: StopCause


@dataclass(frozen=True)
class PauseRanks:
    why: str = "fenced"  # the lease in doubt, or a silent member asked about


@dataclass(frozen=True)
class ResumeRanks:
    why: str


@dataclass(frozen=True)
class DrainRanks:
    pass


@dataclass(frozen=True)
class KillRanks:
    pass


@dataclass(frozen=True)
class AnnounceFailure:
    word: Mapping[str, Any] | None  # the group's failure word (daemon.ranks.failure_notice)


@dataclass(frozen=True)
class AskMember:
    """Ask a spanning group's member (node rank, node id) for a sign of life, as `job`
    shows it."""

    job: JobView
    member: tuple[int, str]


@dataclass(frozen=True)
class SetJobState:
    state: str
    step: int
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FailJob:
    message: str
    step: int


@dataclass(frozen=True)
class EndGeneration:
    slot: int
    ended: int


@dataclass(frozen=True)
class Release:
    """Give back the slot (seat) and the leadership now."""


@dataclass(frozen=True)
class Notify:
    """Tell systemd: `kind` is ready or stopping."""

    kind: str
    text: str


@dataclass(frozen=True)
class Publish:
    """Swap in the node's status now (its etcd record is read from it)."""


Command = (
    Say
    | StartRanks
    | StopRanks
    | PauseRanks
    | ResumeRanks
    | DrainRanks
    | KillRanks
    | AnnounceFailure
    | AskMember
    | SetJobState
    | FailJob
    | EndGeneration
    | Release
    | Notify
    | Publish
)


@dataclass(frozen=True)
class Decision:
    state: State
    commands: tuple[Command, ...] = ()

    def preceded_by(self, *earlier: Command) -> Decision:
        """This decision with `earlier` carried out before its own commands."""
        return Decision(self.state, (*earlier, *self.commands))


def to(state: State, *commands: Command) -> Decision:
    """Move to `state` once `commands` are carried out."""
    return Decision(state, commands)


def info(event: str, **fields: Any) -> Say:
    return Say("info", event, fields)


def warning(event: str, **fields: Any) -> Say:
    return Say("warning", event, fields)


def error(event: str, **fields: Any) -> Say:
    return Say("error", event, fields)


def carry_out(
    commands: tuple[Command, ...],
    parts: Parts,
    log: Any,
    publish: Callable[[], None],
) -> None:
    """Each command, in order, by the part it concerns."""
    ranks, upkeep = parts.ranks, parts.upkeep
    for c in commands:
        match c:
            case Say(level, event, fields):
                getattr(log, level)(event, **fields)
            case StartRanks(slot, lighthouse, part, reached, restart):
                ranks.start(slot, lighthouse, part, reached, restart=restart)
            case StopRanks(cause):
                ranks.stop(cause)
            case PauseRanks(why):
                ranks.pause(why)
            case ResumeRanks(why):
                ranks.resume(why)
            case DrainRanks():
                ranks.drain()
            case KillRanks():
                ranks.kill()
            case AnnounceFailure(word):
                upkeep.announce_failure(dict(word) if word is not None else None)
            case AskMember(job, member):
                upkeep.ask_member(job, member)
            case SetJobState(state, step, extra):
                upkeep.set_state(state, step, **extra)
            case FailJob(message, step):
                upkeep.fail_job(message, step)
            case EndGeneration(slot, ended):
                upkeep.end_generation(slot, ended)
            case Release():
                upkeep.release()
            case Notify("ready", text):
                parts.notifier.ready(text)
            case Notify(_, text):
                parts.notifier.stopping(text)
            case Publish():
                publish()
