"""Groups that span nodes, their pure parts: seat numbering, the job view's seats, and
when a node's part of a group may start or must stop (``daemon.supervision.spanning``)."""

from __future__ import annotations

from typing import Any

from daemon.coordination.job_view import JobView, assemble
from daemon.coordination.slots import slot_of, slot_suffix
from daemon.supervision.spanning import SpanningGroup
from daemon.surfaces.status import group_states


def holder(node: str) -> dict[str, str]:
    return {"node": node, "instance": "i"}


def job(
    seats: dict[int, dict[int, str]],
    generation: int | None = None,
    store: dict[str, Any] | None = None,
    records: dict[str, dict[str, Any]] | None = None,
) -> JobView:
    entries: list[tuple[str, Any, int]] = [
        (f"seats/{g}/{r}", holder(n), 1) for g, held in seats.items() for r, n in held.items()
    ]
    if generation is not None:
        entries.append(("generation/1", {"generation": generation}, 1))
    if store is not None:
        entries.append(("stores/1", store, 1))
    entries += [(f"nodes/{n}", record, 1) for n, record in (records or {}).items()]
    return assemble(entries)


def test_seats_are_numbered_group_by_group_and_read_back() -> None:
    assert [slot_suffix(s, 2) for s in range(4)] == ["0/0", "0/1", "1/0", "1/1"]
    assert [slot_of(slot_suffix(s, 3), 3) for s in range(9)] == list(range(9))
    assert slot_of("1/2", 2) is None and slot_of("x/0", 2) is None and slot_of("3", 2) is None
    assert slot_suffix(5, 1) == "5" and slot_of("5", 1) == 5


def test_the_view_holds_seats_generations_and_names_a_group_by_its_lowest_seat() -> None:
    view = job({0: {0: "a", 1: "b"}, 1: {1: "d"}}, generation=4)
    assert view.seats == {0: {0: "a", 1: "b"}, 1: {1: "d"}}
    assert view.groups == {0: "a", 1: "d"} and view.generations == {1: 4}
    assert view.whole_groups(2) == [0] and view.holders() == {"a", "b", "d"}


def test_a_group_waits_for_its_seats_then_its_first_node_starts_and_the_others_follow() -> None:
    first, second = SpanningGroup(2), SpanningGroup(2)
    short = job({1: {0: "a"}})
    assert "1 of job.nodes_per_group=2 seats held" in str(first.missing(short, 1, 0))
    whole = job({1: {0: "a", 1: "b"}}, generation=3)
    assert first.missing(whole, 1, 0) is None  # the first node moves it on and publishes
    assert "first node (a)" in str(second.missing(whole, 1, 1))  # no store for 3 yet
    store = {"generation": 3, "addr": "10.0.0.1", "port": 29500, "replica_uuid": "u"}
    published = job({1: {0: "a", 1: "b"}}, generation=3, store=store)
    assert second.missing(published, 1, 1) is None
    part = second.joined(published, 1, 1)
    assert part is not None and part.seat.master_addr == "10.0.0.1" and part.master_port == 29500
    assert part.seat.node_rank == 1 and part.replica_uuid == "u" and part.generation == 3
    second.started(published, 1, 3)
    assert "first node (a)" in str(second.missing(published, 1, 1)), "ran 3 already"


def test_the_first_node_waits_while_a_member_still_runs_an_older_generation() -> None:
    first = SpanningGroup(2)
    running = {"b": {"generation": 2, "state": "running"}}
    view = job({1: {0: "a", 1: "b"}}, generation=3, records=running)
    assert first.missing(view, 1, 0) == "b (node rank 1) to stop its ranks of generation 2"
    stopped = job({1: {0: "a", 1: "b"}}, generation=3, records={"b": {"generation": None}})
    assert first.missing(stopped, 1, 0) is None


def test_the_member_a_group_waits_on_is_named_only_once_the_nodes_part_ran() -> None:
    first, second = SpanningGroup(2), SpanningGroup(2)
    running = {"b": {"generation": 2, "state": "running"}}
    view = job({1: {0: "a", 1: "b"}}, generation=3, records=running)
    # Before this node's first generation nobody is asked for a sign of life: the group is
    # still forming, and every member is expected to be starting.
    assert first.blocker(view, 1, 0) is None and second.blocker(view, 1, 1) is None
    first.started(view, 1, 2)
    second.started(view, 1, 2)
    assert first.blocker(view, 1, 0) == (1, "b")  # still running generation 2
    assert second.blocker(view, 1, 1) == (0, "a")  # no store for generation 3 yet
    stopped = job({1: {0: "a", 1: "b"}}, generation=3, records={"b": {"generation": None}})
    assert first.blocker(stopped, 1, 0) is None
    store = {"generation": 3, "addr": "10.0.0.1", "port": 29500}
    published = job({1: {0: "a", 1: "b"}}, generation=3, store=store)
    assert second.blocker(published, 1, 1) is None
    # A seat already free is not a member to wait on: the group waits for a node.
    assert first.blocker(job({1: {0: "a"}}, generation=3), 1, 0) is None


def test_ranks_stop_when_the_generation_moves_on_or_a_seat_changes_hands() -> None:
    node = SpanningGroup(2)
    view = job({1: {0: "a", 1: "b"}}, generation=5)
    node.started(view, 1, 5)
    assert node.must_stop(view, 1) is None
    # A view older than our own start (the watch not caught up) reads a lower generation.
    assert node.must_stop(job({1: {0: "a", 1: "b"}}, generation=4), 1) is None
    assert "generation 6" in str(node.must_stop(job({1: {0: "a", 1: "b"}}, generation=6), 1))
    assert "lost b" in str(node.must_stop(job({1: {0: "a"}}, generation=5), 1))
    assert "lost b" in str(node.must_stop(job({1: {0: "a", 1: "e"}}, generation=5), 1))
    assert node.stopped() == 5 and node.must_stop(view, 1) is None


def test_status_names_each_spanning_groups_state() -> None:
    spec = {"sections": {"job.nodes_per_group": "2"}}
    records = {
        "a": {"state": "running", "generation": 3},
        "b": {"state": "running", "generation": 3},
        "c": {"state": "waiting", "generation": None},
        "d": {"state": "restarting", "generation": None},
        "e": {"state": "waiting", "generation": None},
        "f": {"state": "waiting", "generation": None},
    }
    entries: list[tuple[str, Any, int]] = [("spec", spec, 1)]
    for g, pair in enumerate((("a", "b"), ("c", "d"), ("e", "f"), ("g",))):
        entries += [(f"seats/{g}/{r}", holder(n), 1) for r, n in enumerate(pair)]
        entries.append((f"generation/{g}", {"generation": 3}, 1))
    entries += [(f"nodes/{n}", r, 1) for n, r in records.items()]
    assert group_states(assemble(entries)) == {
        "0": "running",
        "1": "restarting",
        "2": "forming",
        "3": "waiting for nodes",
    }


def test_a_spare_joins_only_a_generation_started_for_it() -> None:
    """A spare that took a lost member's seat while the first node's ranks still ran
    waits for the store of a generation started with it in that seat; a store of the
    old members (or one without members, as older daemons wrote) is not its own."""
    spare = SpanningGroup(2)
    store = {"generation": 5, "addr": "10.0.0.1", "port": 29500, "replica_uuid": "u"}
    old = job({1: {0: "a", 1: "s"}}, generation=5, store={**store, "members": ["a", "b"]})
    assert "first node (a)" in str(spare.missing(old, 1, 1))
    ours = job(
        {1: {0: "a", 1: "s"}}, generation=6, store={**store, "generation": 6, "members": ["a", "s"]}
    )
    assert spare.missing(ours, 1, 1) is None
    unnamed = job({1: {0: "a", 1: "s"}}, generation=5, store=store)
    assert spare.missing(unnamed, 1, 1) is None  # a store from before members were named
