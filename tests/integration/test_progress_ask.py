"""A node back from a lost lease asks for everyone's progress before it judges its ranks
(daemon/fencing/progress_ask.py), against a real etcd."""

from __future__ import annotations

import time
from typing import Any

import pytest

from daemon.coordination.coordinator import Coordinator
from daemon.coordination.progress import ASK_WAIT_S
from daemon.fencing import ProgressAsk
from tests.support.coordinators import MakeCoordinator

pytestmark = pytest.mark.integration


def attempt(what: str, fn: Any) -> tuple[bool, Any]:
    return True, fn()  # errors are the test's failures here


def asking(make: MakeCoordinator) -> tuple[Coordinator, Coordinator, ProgressAsk]:
    back, other = make("back"), make("other")
    back.register({"state": "fenced"})
    other.register({"state": "running"})
    other.put_progress({"step": 40})  # before the ask: ≤ PROGRESS_EVERY_S old
    return back, other, ProgressAsk(back, attempt)


def test_the_others_answers_give_their_current_steps(make_coordinator: MakeCoordinator) -> None:
    back, other, ask = asking(make_coordinator)
    assert ask.nodes(back.snapshot()) is None, "nobody has answered yet: hold"
    other.put_progress({"step": 57})  # what a daemon does when its watch hears the ask
    answer = ask.nodes(back.snapshot())
    assert answer is not None
    nodes, complete = answer
    assert complete and nodes["other"]["step"] == 57


def test_a_running_node_that_does_not_answer_is_not_trusted(
    make_coordinator: MakeCoordinator,
) -> None:
    back, _, ask = asking(make_coordinator)
    started = time.monotonic()
    answer = None
    while answer is None and time.monotonic() - started < ASK_WAIT_S + 5:
        answer = ask.nodes(back.snapshot())
        time.sleep(0.2)
    assert answer is not None and time.monotonic() - started >= ASK_WAIT_S
    nodes, complete = answer
    assert not complete, "its step (40) is from before the ask: it may have gone on since"
    assert nodes["other"]["step"] == 40
