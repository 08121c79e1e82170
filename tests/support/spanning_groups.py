"""What the tests of replica groups that span nodes share (issue 37): the job settings,
who holds which seat, and what their daemons logged."""

from __future__ import annotations

from collections.abc import Sequence

from tests.support.harness import Daemon, Event, event_time, wait_for

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


def stepped_aside_before_revoking(
    asker: Daemon, lost: str, others: Sequence[Daemon], cut: float
) -> Event:
    """A member `lost` at `cut` (epoch s) without a word: `asker`, its group's other node,
    paused its ranks naming it and announced its group's failure, and the other group's
    nodes (`others`) told their ranks, all before the ask revoked the seat
    (daemon/supervision/aside.py). Returns the revocation."""
    revoked: Event = wait_for(
        lambda: [e for e in asker.events("seat_revoked") if e["member"] == lost],
        60,
        "the silent member's seat to be revoked",
    )[0]
    until = event_time(revoked)

    def between(d: Daemon, name: str) -> list[Event]:
        return [e for e in d.events(name) if cut < event_time(e) <= until]

    said = said_between([asker, *others], cut, until + 1)
    assert [e for e in between(asker, "group_paused") if lost in e["reason"]], said
    assert between(asker, "failure_announced"), said
    told = [e for d in others for e in between(d, "ranks_told")]
    assert [e for e in told if "failed in quorum" in e["reason"]], said
    return revoked
