"""The leader's watchers (daemon.leadership.unreachable): who watches, when a watcher
suspects the leader's host, and when the leader is deposed. Pure logic: the probe's
answers and etcd are stand-ins (the transaction is tested against a real etcd in
tests/integration/test_coordination.py, the whole path in test_multihost_leader_loss)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, cast

from daemon import host_probe as hp
from daemon.coordination import Coordinator
from daemon.coordination.job_view import assemble
from daemon.leadership import unreachable as u


def test_the_first_three_others_by_id_watch_and_a_majority_of_them_must_agree() -> None:
    assert u.watchers_of(["d", "a", "c", "b", "e"], "b") == ("a", "c", "d")
    assert u.watchers_of(["a", "b"], "a") == ("b",)
    assert [u.needed(n) for n in (1, 2, 3)] == [1, 2, 2]


def test_a_connection_is_accepted_refused_or_met_with_silence() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert hp.connect("127.0.0.1", port) == hp.Answer.ACCEPTED
        assert hp.connect("localhost", port) == hp.Answer.ACCEPTED  # a name is resolved
    assert hp.connect("127.0.0.1", port) == hp.Answer.REFUSED  # the host is there
    assert hp.connect("localhost", port) == hp.Answer.REFUSED


class Answers:
    """The probe's answers, one per call; accepted once the script runs out."""

    def __init__(self, script: list[hp.Answer]) -> None:
        self.script, self.asked = list(script), 0

    def __call__(self, host: str, port: int) -> hp.Answer:
        self.asked += 1
        return self.script.pop(0) if self.script else hp.Answer.ACCEPTED


def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_probe_is_silent_after_failures_in_a_row_and_wakes_the_loop_once() -> None:
    woke = threading.Event()
    ok, mute, no = hp.Answer.ACCEPTED, hp.Answer.SILENT, hp.Answer.REFUSED
    answers = Answers([ok, mute, ok, no, mute, mute, mute])
    probe = hp.HostProbe(woke.set, answers)
    try:
        assert not probe.silent  # nothing followed
        probe.follow(("10.0.0.1", 29510))
        _until(lambda: answers.asked >= 3)
        assert not probe.silent and not woke.is_set()  # one silence, then an answer
        _until(lambda: probe.silent)
        assert woke.is_set() and not probe.refused  # a refusal broke the first run
        assert answers.asked >= 6
        probe.follow(("10.0.0.2", 29510))  # a new leader's address: counted afresh
        assert not probe.silent
        probe.follow(None)
        assert not probe.silent
    finally:
        probe.close()


def test_a_probe_that_waits_does_not_hold_back_the_next_and_answers_count_in_order() -> None:
    """The first probe goes unanswered for as long as the test holds it: the next ones
    start meanwhile, and their answers count only once the first one's has."""
    first, rest = threading.Event(), threading.Event()
    calls: list[int] = []
    counting = threading.Lock()  # the probes run on the pool's threads

    def answers(host: str, port: int) -> hp.Answer:
        with counting:
            calls.append(len(calls) + 1)
            number = calls[-1]
        if number == 1:
            first.wait(10)
            return hp.Answer.SILENT
        if number == 2:
            return hp.Answer.SILENT
        rest.wait(10)
        return hp.Answer.ACCEPTED

    woke = threading.Event()
    probe = hp.HostProbe(woke.set, answers)
    try:
        probe.follow(("10.0.0.1", 29510))
        _until(lambda: len(calls) >= 3)  # two more started while the first was out
        assert not probe.silent and not woke.is_set()  # the second's silence waits its turn
        first.set()
        _until(lambda: probe.silent)  # both silent, in the order they started
        assert woke.is_set()
        rest.set()
        _until(lambda: not probe.silent)  # the third was answered
    finally:
        first.set()
        rest.set()
        probe.close()


class Suspects:
    def __init__(self, deposes: bool = True) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.deposes = deposes

    def suspect(self, leader: str, epoch: int | None) -> None:
        self.calls.append(("suspect", leader, epoch))

    def clear(self) -> None:
        self.calls.append(("clear",))

    def depose(self, leader: str) -> bool:
        self.calls.append(("depose", leader))
        return self.deposes


class Probe:
    def __init__(self, silent: bool) -> None:
        self.silent, self.closed = silent, False
        self.following: str | None = "unset"

    def follow(self, target: tuple[str, int] | None) -> None:
        self.following = None if target is None else f"{target[0]}:{target[1]}"

    def close(self) -> None:
        self.closed = True


def _job(
    leader: str | None,
    nodes: list[str],
    suspects: dict[str, Any] | None = None,
    published: bool = True,
) -> Any:
    entries: list[tuple[str, Any, int]] = [(f"nodes/{n}", {"host": n}, 2) for n in nodes]
    if leader is not None:
        entries += [("leader", {"node": leader, "instance": "i"}, 7)]
    if leader is not None and published:
        entries += [("lighthouse", f"{leader}:29510", 8)]
    entries += [(f"suspects/{n}", v, 9) for n, v in (suspects or {}).items()]
    return assemble(entries, 10)


def _watch(me: str, silent: bool) -> tuple[u.UnreachableLeader, Suspects, Probe]:
    suspects, probe = Suspects(), Probe(silent)
    coord = cast(Coordinator, type("C", (), {"suspects": suspects})())
    return u.UnreachableLeader(me, coord, cast(hp.HostProbe, probe)), suspects, probe


def test_a_watcher_that_hears_the_leader_writes_nothing() -> None:
    watch, suspects, probe = _watch("b", silent=False)
    watch.round(_job("a", ["a", "b", "c"]), leading=False)
    assert probe.following == "a:29510" and suspects.calls == []


def test_a_node_that_is_no_watcher_or_leads_does_not_probe() -> None:
    watch, suspects, probe = _watch("e", silent=True)
    watch.round(_job("a", ["a", "b", "c", "d", "e"]), leading=False)
    assert probe.following is None and suspects.calls == []
    watch, suspects, probe = _watch("a", silent=True)
    watch.round(_job("a", ["a", "b", "c"]), leading=True)
    assert probe.following is None and suspects.calls == []


def test_one_silent_watcher_of_two_suspects_and_the_second_deposes() -> None:
    nodes = ["a", "b", "c"]
    job = _job("a", nodes)
    watch, suspects, _ = _watch("b", silent=True)
    watch.round(job, leading=False)
    assert suspects.calls == [("suspect", "a", job.leader_epoch)]  # 1 of 2: no majority
    watch.round(job, leading=False)
    assert suspects.calls == [("suspect", "a", job.leader_epoch)]  # written once
    agreed = _job("a", nodes, {"c": {"leader": "a", "epoch": job.leader_epoch}})
    watch.round(agreed, leading=False)
    assert suspects.calls[-1] == ("depose", "a")


def test_a_suspicion_of_another_term_does_not_count() -> None:
    nodes = ["a", "b", "c"]
    watch, suspects, _ = _watch("b", silent=True)
    stale = _job("a", nodes, {"c": {"leader": "a", "epoch": 1}})
    watch.round(stale, leading=False)
    assert [c[0] for c in suspects.calls] == ["suspect"]


def test_the_only_watcher_of_a_two_node_job_deposes_alone() -> None:
    watch, suspects, _ = _watch("b", silent=True)
    watch.round(_job("a", ["a", "b"]), leading=False)
    assert [c[0] for c in suspects.calls] == ["suspect", "depose"]


def test_a_leader_that_answers_again_or_a_vacancy_clears_the_suspicion() -> None:
    watch, suspects, probe = _watch("b", silent=True)
    job = _job("a", ["a", "b", "c"])
    watch.round(job, leading=False)
    probe.silent = False
    watch.round(job, leading=False)
    assert suspects.calls[-1] == ("clear",) and watch.suspected is None
    probe.silent = True
    watch.round(job, leading=False)
    watch.round(_job(None, ["a", "b", "c"]), leading=False)
    assert suspects.calls[-1] == ("clear",)
    assert probe.following == "a:29510"  # still probed: the election skips its own probe


def test_a_new_leader_still_starting_its_lighthouse_is_not_judged_by_the_old_address() -> None:
    """The old leader's host is silent and a new leader holds the key, its lighthouse
    not published yet: nothing is probed or suspected until it publishes its own."""
    watch, suspects, probe = _watch("b", silent=True)
    watch.round(_job("c", ["a", "b", "c"], published=False), leading=False)
    assert probe.following is None and suspects.calls == []
