"""What bench/failover.py measures of each fault, from the daemons' event logs, and its table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.pauses import longest_gap
from tests.support.harness import Daemon, event_time

NO_PAUSE_S = 0.25  # a longest gap this short is a step, not a pause
WINDOW_S = 60.0  # commits this long after a fault are looked at


@dataclass
class Fault:
    name: str
    at: float  # epoch seconds
    survivors: list[Daemon]
    until: float = 0.0  # when the bench began to undo it (a restart, a rejoin): the fault's
    # own pause is looked for before then; what the return costs is reported apart
    restarted: tuple[float, dict[str, Any]] | None = None  # (daemon start, its first commit)
    group: Daemon | None = None  # the group whose rank was killed (d)
    next_at: float = 0.0  # when the next fault began (0: none)
    extra: dict[str, float] = field(default_factory=dict)


def _commits(d: Daemon, start: float, end: float) -> list[float]:
    return [t for e in d.events("train_step") if start <= (t := event_time(e)) <= end]


def measure(f: Fault) -> dict[str, Any]:
    row: dict[str, Any] = {"fault": f.name}
    until = min(f.until or f.at + WINDOW_S, f.next_at or math.inf)
    pauses = [longest_gap(_commits(d, f.at - 10.0, until), f.at) for d in f.survivors]
    row["survivors_longest_pause_s"] = round(max(p for p, _ in pauses), 3)
    longest = max(p for p, _ in pauses)
    # Without a pause (an etcd pause) there is nothing to come back from.
    back_at = max(end for _, end in pauses) - f.at if longest > NO_PAUSE_S else None
    row["every_live_group_commits_again_s"] = None if back_at is None else round(back_at, 3)
    if f.until:  # the node back (restarted, rejoined) joins the quorum: what that cost
        end = min(f.until + 30.0, f.next_at or math.inf)
        back = [longest_gap(_commits(d, f.until - 10.0, end), f.until) for d in f.survivors]
        row["survivors_pause_at_return_s"] = round(max(p for p, _ in back), 3)
    last = min(f.until or f.at + WINDOW_S, f.next_at or math.inf)
    elected = [
        event_time(e)
        for d in f.survivors
        for e in d.events("leader_elected")
        if f.at < event_time(e) < last
    ]
    row["group_restarts"] = sum(
        f.at < event_time(e) < last for d in f.survivors for e in d.events("group_restarted")
    )
    # A survivor that announced a failure of its own group (daemon/ranks/failure_notice.py):
    # none is due, so in the quiet run any is a false announcement.
    row["survivor_failures_announced"] = sum(
        f.at < event_time(e) < last for d in f.survivors for e in d.events("failure_announced")
    )
    row["new_leader_s"] = round(min(elected) - f.at, 3) if elected else None
    if f.restarted is not None:
        started, first = f.restarted
        row["restarted_start_to_commit_s"] = round(event_time(first) - started, 3)
    if f.group is not None:
        again = _commits(f.group, f.at, last)
        row["group_commits_again_s"] = round(again[0] - f.at, 3) if again else None
    return row


METRICS = (
    "survivors_longest_pause_s",
    "new_leader_s",
    "every_live_group_commits_again_s",
    "restarted_start_to_commit_s",
    "survivors_pause_at_return_s",
    "group_commits_again_s",
    "group_restarts",
    "survivor_failures_announced",
)


def report(rows: Sequence[dict[str, Any]]) -> str:
    """min / median / max of each figure, per fault kind."""
    lines = [f"{'fault':<42} {'figure':<34} {'min':>7} {'median':>7} {'max':>7}  n"]
    for name in dict.fromkeys(r["fault"] for r in rows):
        mine = [r for r in rows if r["fault"] == name]
        for metric in METRICS:
            values = [r[metric] for r in mine if r.get(metric) is not None]
            if not values:
                continue
            lines.append(
                f"{name:<42} {metric:<34} {min(values):7.2f} "
                f"{statistics.median(values):7.2f} {max(values):7.2f}  {len(values)}"
            )
    return "\n".join(lines)
