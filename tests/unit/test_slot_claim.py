"""The slot claim's retry after a lost race (pure logic: the transaction is a stand-in
that plays the etcd compare-and-create against a dict of held keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from daemon.coordination import slots

PREFIX = "job/seats/"


@dataclass(frozen=True)
class Kv:
    key: bytes
    value: bytes


class Race:
    """Held slot keys; before this node's transaction the rivals in `before` win theirs."""

    def __init__(self, before: list[list[int]], nodes_per_group: int) -> None:
        self.keys: dict[str, bytes] = {}
        self.before, self.npg, self.tried = before, nodes_per_group, list[int]()

    def held(self) -> list[Kv]:
        return [Kv((PREFIX + k).encode(), v) for k, v in self.keys.items()]

    def __call__(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        for rival in self.before.pop(0) if self.before else []:
            self.keys[slots.slot_suffix(rival, self.npg)] = b'{"node": "rival"}'
        key = compare[0].key
        suffix = (key.decode() if isinstance(key, bytes) else str(key))[len(PREFIX) :]
        self.tried.append(slots.slot_of(suffix, self.npg) or 0)
        if suffix in self.keys:
            return False, [self.held()]
        self.keys[suffix] = b'{"node": "me"}'
        return True, []


def claim(race: Race, joiners: int, node_id: str) -> int | None:
    return slots.claim_free(
        race, PREFIX, {}, "me", 1, node_id=node_id, max_replicas=6,
        preferred=None, joiners=joiners, nodes_per_group=2,
    )  # fmt: skip


def first_pick(node_id: str, joiners: int) -> int:
    return slots.pick(list(range(6)), joiners, node_id, 0)


def test_a_retry_after_a_lost_race_takes_the_lowest_seat_left() -> None:
    # Two joiners, one seat left between them after a rival took the one this node tried:
    # the retry must take the lowest free seat, never one beyond the joiners' seats.
    for n in range(64):
        node_id = f"node-{n}"
        tried = first_pick(node_id, 2)
        race = Race([[tried]], nodes_per_group=2)
        got = claim(race, joiners=2, node_id=node_id)
        assert got == min({0, 1} - {tried}), (node_id, race.tried)


def test_rivals_that_won_elsewhere_leave_fewer_joiners() -> None:
    # Three joiners; while this node tried its seat, both others won theirs, one of them
    # this node's: the seats taken stay the lowest three.
    for n in range(64):
        node_id = f"node-{n}"
        tried = first_pick(node_id, 3)
        rivals = [tried, next(s for s in range(3) if s != tried)]
        race = Race([rivals], nodes_per_group=2)
        got = claim(race, joiners=3, node_id=node_id)
        assert {got, *rivals} == {0, 1, 2}, (node_id, race.tried)


def test_a_lone_joiner_takes_the_lowest_free_seat() -> None:
    race = Race([], nodes_per_group=2)
    assert claim(race, joiners=1, node_id="solo") == 0
