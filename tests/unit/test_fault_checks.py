"""The random-fault test's checks of committed steps (tests/support/fault_checks.py), on
made-up timelines: the steps a partition's cut-off side committed before it logged their
discard are not the job's, but only there; and a heal to a step only that side had is
caught."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from tests.support.fault_checks import healed_from_losing_side, lost_steps, timeline
from tests.support.faults import Cluster, Fault
from tests.support.harness import Event

T0 = 1_800_000_000.0


def at(t: float) -> str:
    return datetime.fromtimestamp(T0 + t, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Life:
    node_id: str
    log: list[Event] = field(default_factory=list)

    def events(self, name: str | None = None) -> list[Event]:
        return [e for e in self.log if name is None or e["event"] == name]

    def steps(self, first: int, last: int, start: float, every: float = 0.1) -> Life:
        for i, step in enumerate(range(first, last + 1)):
            self.log.append({"event": "train_step", "step": step, "time": at(start + i * every)})
        return self

    def logs(self, event: str, t: float, **fields: object) -> Life:
        self.log.append({"event": event, "time": at(t), **fields})
        return self


@dataclass
class Lives:
    lives: list[Life]

    def every_life(self) -> list[Life]:
        return self.lives


def cluster(*lives: Life) -> Cluster:
    return cast(Cluster, Lives(list(lives)))


def isolated(node: str, started: float, whole: float) -> Fault:
    return Fault("host_isolated", node, 6.0, T0 + started, T0 + started + 6.0, T0 + whole)


def cut_off_leader(discard_at: float | None) -> Cluster:
    """node-a leads and is cut off at t=10 at step 59: it goes on alone to step 64 while b
    and c elect a leader and go on from 59; a's ranks restart and heal from them."""
    a = Life("node-a").steps(50, 59, 9.0).steps(60, 64, 12.0)
    if discard_at is not None:
        a.logs("fence_discarding", discard_at, reason="a new leader epoch", step=64)
    a.logs("heal_done", 17.15, step=121).steps(122, 130, 17.2)
    b = Life("node-b").steps(50, 59, 9.0).steps(60, 130, 11.0)
    c = Life("node-c").steps(50, 59, 9.0).steps(60, 130, 11.0)
    return cluster(a, b, c)


def test_a_cut_off_sides_steps_before_its_logged_discard_are_not_lost_steps() -> None:
    c = cut_off_leader(discard_at=17.0)
    faults = [isolated("a", started=10.0, whole=20.0)]
    assert lost_steps(c, faults) == []
    assert healed_from_losing_side(c, faults) == []


def test_without_a_logged_discard_the_cut_off_sides_steps_are_lost_steps() -> None:
    c = cut_off_leader(discard_at=None)
    lost = lost_steps(c, [isolated("a", started=10.0, whole=20.0)])
    assert lost and all(str(x).startswith("node-a committed step 6") for x in lost), lost


def test_the_timeline_of_a_failure_tells_who_committed_what_around_it() -> None:
    c = cut_off_leader(discard_at=None)
    lost = lost_steps(c, [isolated("a", started=10.0, whole=20.0)])
    text = timeline(c, lost[0].t, span_s=2.0).splitlines()
    assert text[0] == f"what the daemons logged around {T0 + 12.0:.1f}:"
    assert f"{T0 + 12.0:.1f} node-a.0   steps 60..64 (participants None) to {T0 + 12.4:.1f}" in text
    assert any(line.split()[1:4] == ["node-b.0", "steps", "60..90"] for line in text), text


def test_a_discard_outside_the_faults_window_excuses_nothing() -> None:
    c = cut_off_leader(discard_at=40.0)
    assert lost_steps(c, [isolated("a", started=10.0, whole=20.0)])


def test_a_heal_to_a_step_only_the_cut_off_side_committed_is_caught() -> None:
    a = Life("node-a").steps(50, 59, 9.0).steps(60, 80, 10.2)
    a.logs("fence_discarding", 16.0, reason="deposed", step=80)
    b = Life("node-b").steps(50, 59, 9.0).steps(60, 70, 12.0)
    b.logs("heal_done", 13.5, step=80)  # b took a's step 80: the majority had 70 at most
    faults = [isolated("a", started=10.0, whole=20.0)]
    taken = healed_from_losing_side(cluster(a, b), faults)
    assert taken == [f"node-b healed to step 80 at {T0 + 13.5:.1f}; the majority had 70"], taken
