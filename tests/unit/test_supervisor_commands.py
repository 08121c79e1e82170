"""The supervisor's handlers decide; the commands they return act (commands.py).

A handler asks its parts questions whose answers decide it, and returns the next state
with what to do as frozen commands; nothing it does reaches a part before it returned.
These tests read the source for any effect called from a handler, read a handler's
decision before it is carried out, and carry out every kind of command once."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import typing
from dataclasses import FrozenInstanceError
from typing import Any, cast

import pytest

from daemon.coordination.job_view import assemble
from daemon.node_state.states import State
from daemon.ranks.stop_cause import FENCED_OUT
from daemon.supervision import commands as do
from daemon.supervision.parts import Parts
from daemon.supervision.reports import upkeep_input
from daemon.supervision.supervisor import HANDLERS, Supervisor
from tests.support.supervisor_fakes import (
    FAILED,
    LIGHTHOUSE,
    node,
    running_ranks,
    stopped_by,
)

# The verbs that change the world: a handler returns them as commands instead.
EFFECTS = {
    "group": {"start", "stop", "pause", "resume", "drain", "kill"},
    "upkeep": {
        "announce_failure",
        "ask_member",
        "set_state",
        "fail_job",
        "release",
        "end_generation",
    },
    "log": {"info", "warning", "error"},
    "notifier": {"ready", "stopping"},
}
DECIDERS = {*(h.__name__ for h in HANDLERS.values()), "_stop", "_drain", "_done", "_fail"}


def test_no_handler_calls_an_effect_it_could_return() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(Supervisor)))
    methods = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    found = []
    for fn in (m for m in methods if m.name in DECIDERS):
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            f = call.func
            if not isinstance(f, ast.Attribute):
                continue
            owner = f.value
            on_self = isinstance(owner, ast.Name) and owner.id == "self"
            if on_self and f.attr == "publish":
                found.append(f"{fn.name}: self.publish()")
            part = owner.attr if isinstance(owner, ast.Attribute) else None
            if part in EFFECTS and f.attr in EFFECTS[part]:
                found.append(f"{fn.name}: self.{part}.{f.attr}()")
    assert found == [], found
    assert {m.name for m in methods} >= DECIDERS


def test_a_failed_group_is_announced_then_stopped_once_the_decision_is_carried_out() -> None:
    n = node(State.RUNNING)
    running_ranks(FAILED)(n)
    n.sup.upkept = n.upkeep.tick(upkeep_input(n.view, n.sup.progress))
    decision = HANDLERS[State.RUNNING](n.sup)
    assert decision.state == State.STOPPING
    kinds = [type(c).__name__ for c in decision.commands]
    assert kinds == ["Say", "AnnounceFailure", "StopRanks"]
    said = cast(do.Say, decision.commands[0])
    assert (said.level, said.event, said.fields["codes"]) == ("warning", "group_failed", [1])
    assert "stop" not in n.ranks.calls and "announce_failure" not in n.upkeep.calls
    n.sup.decide(decision)
    assert n.view.state == State.STOPPING
    assert n.ranks.calls[-1] == "stop" and n.upkeep.calls[-1] == "announce_failure"


def test_a_restart_says_why_in_the_start_it_returns() -> None:
    """The reason STOPPING found travels in the supervisor's own state to the start
    command (group_restarted's `reason`), not through an attribute of the ranks."""
    n = node(State.STOPPING, "node.restart_backoff_s=0")
    stopped_by(FAILED)(n)
    n.sup.tick()
    assert n.view.state == State.RUNNING and n.ranks.restarts == ["rank_exit"]
    assert n.sup.restart_reason is None  # said once
    first = node(State.WAITING)
    first.sup.tick()
    assert first.ranks.restarts == [None]  # a first start: group_started
    fenced = node(State.STOPPING)
    stopped_by(FENCED_OUT)(fenced)
    fenced.sup.tick()
    assert fenced.ranks.restarts == ["fenced"]


def test_the_decisions_are_frozen() -> None:
    decision = do.to(State.RUNNING, do.PauseRanks())
    with pytest.raises(FrozenInstanceError):
        decision.state = State.DONE  # type: ignore[misc]
    assert decision.preceded_by(do.KillRanks()).commands == (do.KillRanks(), do.PauseRanks())


class Recorder:
    """Any verb called on it is recorded as "<name>.<verb>"."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self._name, self._calls = name, calls

    def __getattr__(self, verb: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            self._calls.append(f"{self._name}.{verb}")

        return record


EXAMPLES: dict[type, object] = {
    do.Say: do.info("x", a=1),
    do.StartRanks: do.StartRanks(0, LIGHTHOUSE, None, None, "rank_exit"),
    do.StopRanks: do.StopRanks(FENCED_OUT),
    do.PauseRanks: do.PauseRanks(),
    do.ResumeRanks: do.ResumeRanks("etcd answered"),
    do.DrainRanks: do.DrainRanks(),
    do.KillRanks: do.KillRanks(),
    do.AnnounceFailure: do.AnnounceFailure({"quorum_id": 1}),
    do.AskMember: do.AskMember(assemble([], 1), (1, "node-b")),
    do.SetJobState: do.SetJobState("running", 3),
    do.FailJob: do.FailJob("why", 3),
    do.EndGeneration: do.EndGeneration(0, 4),
    do.Release: do.Release(),
    do.Notify: do.Notify("ready", "claiming"),
    do.Publish: do.Publish(),
}
CARRIED_BY = {
    do.Say: "log.info",
    do.StartRanks: "ranks.start",
    do.StopRanks: "ranks.stop",
    do.PauseRanks: "ranks.pause",
    do.ResumeRanks: "ranks.resume",
    do.DrainRanks: "ranks.drain",
    do.KillRanks: "ranks.kill",
    do.AnnounceFailure: "upkeep.announce_failure",
    do.AskMember: "upkeep.ask_member",
    do.SetJobState: "upkeep.set_state",
    do.FailJob: "upkeep.fail_job",
    do.EndGeneration: "upkeep.end_generation",
    do.Release: "upkeep.release",
    do.Notify: "notifier.ready",
    do.Publish: "publish",
}


def test_every_kind_of_command_is_carried_out_once_by_the_part_it_concerns() -> None:
    assert set(typing.get_args(do.Command)) == set(EXAMPLES) == set(CARRIED_BY)
    for kind, command in EXAMPLES.items():
        calls: list[str] = []
        parts = Parts(
            ranks=cast(Any, Recorder("ranks", calls)),
            upkeep=cast(Any, Recorder("upkeep", calls)),
            health=cast(Any, Recorder("health", calls)),
            notifier=cast(Any, Recorder("notifier", calls)),
        )
        do.carry_out(
            (cast(do.Command, command),),
            parts,
            Recorder("log", calls),
            functools.partial(calls.append, "publish"),
        )
        assert calls == [CARRIED_BY[kind]], (kind.__name__, calls)
    calls = []
    stopping = Parts(*(cast(Any, Recorder(n, calls)) for n in ("r", "u", "h", "notifier")))
    do.carry_out((do.Notify("stopping", "draining"),), stopping, None, lambda: None)
    assert calls == ["notifier.stopping"]


def test_a_drain_logs_tells_systemd_and_drains_in_that_order() -> None:
    n = node(State.RUNNING)
    running_ranks(None)(n)
    decision = n.sup._drain()
    assert [type(c).__name__ for c in decision.commands] == ["Say", "Notify", "DrainRanks"]
    done = n.sup._done("drained")
    assert [type(c).__name__ for c in done.commands] == ["Release", "Say"]
