"""A spanning group's member asked for a sign of life before its seat is revoked
(``daemon.supervision.seat_probe``): the decision against a stand-in for the
coordinator's three calls (the integration test is test_groups_across_nodes's spare)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from daemon.config import load_daemon_config
from daemon.coordination import Coordinator
from daemon.coordination.job_view import assemble
from daemon.coordination.progress import Progress
from daemon.supervision.seat_probe import (
    PROBE_WAIT_S,
    SILENCE_S,
    SILENT_WAIT_S,
    Asking,
    SeatProbe,
    too_still,
)
from daemon.supervision.seats import Seats

JOB = Path(__file__).resolve().parents[1] / "integration" / "daemon_job.toml"


class Etcd:
    """The progress keys and seats a probe reads and changes."""

    def __init__(self) -> None:
        self.revision = 10
        self.progress: dict[str, Progress] = {}
        self.seats = {3: "b"}
        self.asks = 0

    def ask_progress(self) -> int:
        self.asks += 1
        self.revision += 1
        return self.revision

    def read_progress(self) -> dict[str, Progress]:
        return dict(self.progress)

    def revoke_seat(self, seat: int, nodes_per_group: int, member: str) -> bool:
        if self.seats.get(seat) != member:
            return False
        del self.seats[seat]
        return True

    def answer(self, node: str) -> None:
        self.revision += 1
        self.progress[node] = Progress(5, self.revision, {})


def attempt(name: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
    return True, fn()


def probe(etcd: Etcd, now: list[float]) -> SeatProbe:
    return SeatProbe(cast(Coordinator, etcd), attempt, 2, clock=lambda: now[0])


def test_a_member_that_gives_no_sign_of_life_loses_its_seat_once() -> None:
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    assert not p.check("b", 3, 7) and etcd.asks == 1  # asked
    etcd.progress["b"] = Progress(5, 9, {})  # an old write is not an answer
    now[0] += PROBE_WAIT_S / 2
    assert not p.check("b", 3, 7) and etcd.seats == {3: "b"}  # not yet
    now[0] += PROBE_WAIT_S
    assert p.check("b", 3, 7) and etcd.seats == {}  # revoked
    now[0] += PROBE_WAIT_S
    assert not p.check("b", 3, 7) and etcd.asks == 1  # settled: nothing more


def test_a_member_that_answers_keeps_its_seat_until_the_next_generation() -> None:
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    p.check("b", 3, 7)
    etcd.answer("b")
    now[0] += 10 * PROBE_WAIT_S
    assert not p.check("b", 3, 7) and etcd.seats == {3: "b"}
    assert not p.check("b", 3, 7) and etcd.asks == 1
    p.check("b", 3, 8)  # the group moved on, and waits on it again: asked again
    assert etcd.asks == 2
    now[0] += 10 * PROBE_WAIT_S
    assert p.check("b", 3, 8) and etcd.seats == {}


def test_a_seat_that_changed_hands_meanwhile_is_left_alone() -> None:
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    p.check("b", 3, 7)
    etcd.seats[3] = "e"  # b's lease lapsed and a spare took the seat
    now[0] += 10 * PROBE_WAIT_S
    assert not p.check("b", 3, 7) and etcd.seats == {3: "e"}


def test_only_ranks_still_where_a_member_blocks_them_ask_and_long_steps_ask_later() -> None:
    now = 100.0
    assert too_still(now - SILENCE_S - 0.1, now, ["step", "quorum"], None)
    assert not too_still(now - SILENCE_S + 0.1, now, ["step"], None)
    # A build, a load, a save or an evaluation may be long by itself: nothing is asked.
    for phase in ("start", "load", "save", "eval", "finish"):
        assert not too_still(now - 60, now, ["step", phase], None), phase
    # Steps of 5 s are still 10 s before anyone is asked.
    assert not too_still(now - 9.0, now, ["step"], 5.0)
    assert too_still(now - 10.5, now, ["step"], 5.0)
    assert not too_still(None, now, ["step"], None) and not too_still(now - 60, now, [], None)


def _wait(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_member_whose_status_port_refuses_loses_its_seat_without_the_wait() -> None:
    """Its host is up and nothing listens on its daemon's status port (the daemon died
    with its ranks): revoked once two connections in a row were refused, before
    PROBE_WAIT_S; a member whose port listens is left to the ask."""
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        try:
            assert not p.check("b", 3, 7, ("127.0.0.1", port)) and etcd.asks == 1
            assert _wait(lambda: p.check("b", 3, 7, ("127.0.0.1", port)))
            assert etcd.seats == {} and now[0] == 100.0  # no time passed on the ask's clock
        finally:
            p.close()
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = ("127.0.0.1", listening.getsockname()[1])
        try:
            p.check("b", 3, 7, address)
            assert not _wait(lambda: p.check("b", 3, 7, address), 1.0)
            assert etcd.seats == {3: "b"}
            now[0] += PROBE_WAIT_S
            assert p.check("b", 3, 7, address) and etcd.seats == {}  # the ask's own wait
        finally:
            p.close()


def _silent_port() -> tuple[socket.socket, socket.socket]:
    """A listener whose accept queue is full: this kernel drops further SYNs, so a
    connection to it gets no answer at all, as a host without power gives none."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(0)
    queued = socket.create_connection(listening.getsockname(), timeout=1.0)
    return listening, queued


def test_a_member_whose_status_port_answers_nothing_loses_its_seat_after_the_shorter_wait() -> None:
    """Silent as well as unanswered through etcd (a lost host): revoked once the ask has
    waited SILENT_WAIT_S, not PROBE_WAIT_S; an answer through etcd (a split) still keeps
    the seat."""
    assert SILENT_WAIT_S < PROBE_WAIT_S
    listening, queued = _silent_port()
    address = listening.getsockname()
    try:
        etcd, now = Etcd(), [100.0]
        p = probe(etcd, now)
        try:
            assert not p.check("b", 3, 7, address)
            assert not _wait(lambda: p.check("b", 3, 7, address), 1.0)  # no time on its clock
            now[0] += SILENT_WAIT_S
            assert p.check("b", 3, 7, address) and etcd.seats == {}
        finally:
            p.close()
        etcd, now = Etcd(), [100.0]
        p = probe(etcd, now)
        try:
            p.check("b", 3, 7, address)
            etcd.answer("b")
            now[0] += SILENT_WAIT_S
            assert not _wait(lambda: p.check("b", 3, 7, address), 1.0)
            assert etcd.seats == {3: "b"}
        finally:
            p.close()
    finally:
        queued.close()
        listening.close()


def test_a_member_already_unheard_loses_its_seat_in_the_round_that_asks() -> None:
    etcd, now = Etcd(), [100.0]
    p = probe(etcd, now)
    assert p.check("b", 3, ("unheard", 1), unheard=True) and etcd.seats == {}
    assert etcd.asks == 1  # asked all the same: its answer settles nothing now
    assert not p.check("b", 3, ("unheard", 1), unheard=True)  # once per generation


def test_the_running_members_status_ports_are_watched_and_a_dead_one_is_unheard(
    tmp_path: Path,
) -> None:
    """Seats.watch: while our ranks run, every other member of our spanning group is
    probed; a port that refuses is unheard within a few probes, a listening one never."""
    cfg = load_daemon_config(JOB, ["node.id=a", "job.nodes_per_group=2", "parallel.dp_shard=2"])
    seats = Seats(cfg, cast(Coordinator, Etcd()), cast(Any, None), tmp_path)
    seats.slot, seats.node_rank = 1, 0
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        ports = {"b": listening.getsockname()[1], "c": closed.getsockname()[1]}
        records = [
            (f"nodes/{n}", {"host": "127.0.0.1", "http_port": p}, 2) for n, p in ports.items()
        ]
        seated = [("seats/1/0", {"node": "a"}, 3), ("seats/1/1", {"node": "b"}, 3)]
        try:
            seats.watch(assemble([*records, *seated], 4))
            assert not _wait(lambda: bool(seats.gone()), 1.0)  # b listens
            moved = [("seats/1/0", {"node": "a"}, 3), ("seats/1/1", {"node": "c"}, 5)]
            seats.watch(assemble([*records, *moved], 6))  # c took the seat; its port refuses
            assert _wait(lambda: seats.gone() == ("c",))
            seats.watch(None)  # our ranks stopped: nothing is watched
            assert seats.gone() == ()
        finally:
            seats.close()


def test_a_round_of_asks_says_which_went_out_which_wait_and_what_was_revoked(
    tmp_path: Path,
) -> None:
    """Seats.probe_members: an ask goes out once per silence (`began` in that round
    only), waits until the member answers or PROBE_WAIT_S passes, then its seat goes."""
    cfg = load_daemon_config(JOB, ["node.id=a", "job.nodes_per_group=2", "parallel.dp_shard=2"])
    etcd, now = Etcd(), [100.0]
    etcd.seats = {3: "b"}
    seats = Seats(cfg, cast(Coordinator, etcd), cast(Any, attempt), tmp_path)
    seats._probe = probe(etcd, now)  # the ask's clock, moved by hand
    seats.slot, seats.node_rank = 1, 0
    job = assemble([("seats/1/0", {"node": "a"}, 3), ("seats/1/1", {"node": "b"}, 3)], 4)
    try:
        first = seats.probe_members(job, 50.0)
        assert first.began == ("b",) and first.waiting and not first.revoked
        again = seats.probe_members(job, 50.0)
        assert again.began == () and again.waiting and etcd.asks == 1
        etcd.answer("b")
        assert seats.probe_members(job, 50.0) == Asking()  # answered: nothing waits
        later = seats.probe_members(job, 60.0)  # a new silence of our ranks: asked again
        assert later.began == ("b",) and etcd.asks == 2
        now[0] += PROBE_WAIT_S
        assert seats.probe_members(job, 60.0) == Asking(revoked=True) and etcd.seats == {}
    finally:
        seats.close()
