"""What the tests of replica groups that span nodes share (issue 37): the job settings,
who holds which seat, and what their daemons logged."""

from __future__ import annotations

from collections.abc import Sequence

from tests.support.harness import Daemon, Event, event_time

SPAN = [
    "job.nodes_per_group=2",
    "parallel.dp_shard=2",
    "train.log_every=1",
    "ft.quorum_timeout_s=30",
]


def seats(daemons: Sequence[Daemon]) -> dict[tuple[int, int], Daemon]:
    """(group, node rank) -> the daemon holding that seat, from each one's /status."""
    held = {}
    for d in daemons:
        doc = d.status()
        if doc is not None and doc["replica_group"] is not None:
            held[(int(doc["replica_group"]), int(doc["node_rank"]))] = d
    return held


def stops(d: Daemon) -> list[dict[str, object]]:
    """The daemon's group stops: its ranks failed, or it stopped them (a new generation)."""
    return sorted(d.events("group_failed") + d.events("group_stopping"), key=event_time)


def together_since(daemons: Sequence[Daemon], after: float) -> list[Event]:
    """The `train_step` events of `daemons` after `after` (epoch s) with both groups in
    the quorum."""
    return [
        e
        for d in daemons
        for e in d.events("train_step")
        if event_time(e) > after and e.get("participants") == 2
    ]


def said_between(daemons: Sequence[Daemon], after: float, before: float) -> str:
    """What `daemons` logged between two times, but their train steps: one line each."""
    lines = [
        f"{event_time(e) - after:7.2f}s {d.node_id} "
        + " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "job"))[:300]
        for d in daemons
        for e in d.events()
        if "time" in e
        and after < event_time(e) < before
        and e.get("event") not in ("train_step", "rank_output")
    ]
    return "\n".join(sorted(lines, key=lambda line: float(line.split("s ", 1)[0])))


def committed_with(d: Daemon, participants: int, after: float = 0.0) -> bool:
    return any(
        e.get("participants") == participants and event_time(e) > after
        for e in d.events("train_step")
    )
