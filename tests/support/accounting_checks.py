"""Issue 54's checks of the daemons' accounts against the logs and the faults injected:
each daemon's activities (its ``daemon_exit`` ``seconds``, what
``phalanx_activity_seconds_total`` counts) add up to its uptime, the job's goodput from
them agrees with a count from the logs alone, and each fault is one incident."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.coordination.incident_store import KEEP
from tests.support.harness import Daemon, Event, event_time

STEP_ENDS = ("train_step", "step_items")


@dataclass(frozen=True)
class Life:
    """One daemon process that exited: its uptime (daemon_started to daemon_exit, from the
    log's timestamps) and the seconds its ledger counted by activity."""

    name: str  # its log file
    uptime: float
    seconds: Mapping[str, float]

    @property
    def accounted(self) -> float:
        return sum(self.seconds.values())


def life(d: Daemon) -> Life | None:
    """`d`'s life, or None when it never exited by itself (killed: its ledger is gone)."""
    events = d.events()
    started = next((e for e in events if e.get("event") == "daemon_started"), None)
    ended = next((e for e in events if e.get("event") == "daemon_exit"), None)
    if started is None or ended is None:
        return None
    uptime = event_time(ended) - event_time(started)
    return Life(d.proc.stderr.name, uptime, ended["seconds"])


def unaccounted(lives: Sequence[Life], tolerance: float = 0.01) -> list[str]:
    """The lives whose activities do not add up to their uptime within `tolerance`."""
    return [
        f"{x.name}: {x.accounted:.3f} s accounted of {x.uptime:.3f} s up"
        for x in lives
        if abs(x.accounted - x.uptime) > tolerance * x.uptime
    ]


def ledger_goodput(lives: Sequence[Life]) -> float:
    """The job's goodput as the daemons counted it: training over all their seconds (every
    node runs the same number of ranks, so seconds weigh as accelerator-seconds)."""
    return sum(x.seconds["training"] for x in lives) / sum(x.accounted for x in lives)


def fenced(events: Sequence[Event]) -> list[tuple[float, float]]:
    """When the daemon held its ranks paused (FENCED), from its state changes (epoch s)."""
    spans, since = [], None
    for e in events:
        if e.get("event") != "state_changed":
            continue
        if e.get("to") == "fenced":
            since = event_time(e)
        elif e.get("from") == "fenced" and since is not None:
            spans.append((since, event_time(e)))
            since = None
    return spans


def own_time(e: Event, prev: float | None, paused: Sequence[tuple[float, float]]) -> float:
    """A committed step's time from the rank's own timestamps: from the rank's last step
    end (or heal) to this one, less the save and evaluation before it and the part of
    its quorum wait after `prev`, less the time its ranks were held paused (a fence: the
    rank's clock went on while it was stopped). A rank's first step (`prev` None) counts
    from its quorum's end (what came before was its start)."""
    end = event_time(e)
    seconds = float(e.get("step_seconds", 0.0))
    quorum = float(e.get("quorum_s", 0.0))
    step_start = end - seconds
    if prev is None:
        began, work = step_start + quorum, end - step_start - quorum
    else:
        besides = float(e.get("checkpoint_s", 0.0)) + float(e.get("eval_s", 0.0))
        after = max(0.0, min(quorum, step_start + quorum - prev)) if seconds else 0.0
        began, work = prev, end - prev - besides - after
    held = sum(max(0.0, min(end, b) - max(began, a)) for a, b in paused)
    return max(0.0, work - held)


RANK_STARTS = ("group_started", "group_restarted")
STEP_ENDS_ALL = (*STEP_ENDS, "step_skipped", "step_abandoned")


def log_goodput(lives_by_node: Mapping[str, Sequence[Daemon]], exited: Sequence[Life]) -> float:
    """The job's goodput counted from the logs alone (:func:`logged_training`) over the
    uptime of the daemons that exited. Steps of a daemon that was killed count for
    neither side."""
    trained = logged_training(_histories(lives_by_node))
    return sum(trained[x.name] for x in exited) / sum(x.uptime for x in exited)


def goodput_by_life(lives_by_node: Mapping[str, Sequence[Daemon]], exited: Sequence[Life]) -> str:
    """Each exited daemon's training seconds by its ledger and by its log, for a failure."""
    trained = logged_training(_histories(lives_by_node))
    return "; ".join(
        f"{Path(x.name).name}: {x.seconds['training']:.2f} s ledger, {trained[x.name]:.2f} s log"
        for x in exited
    )


def _histories(lives_by_node: Mapping[str, Sequence[Daemon]]) -> list[tuple[str, list[Event]]]:
    return [(d.proc.stderr.name, d.events()) for lives in lives_by_node.values() for d in lives]


def logged_training(histories: Sequence[tuple[str, Sequence[Event]]]) -> dict[str, float]:
    """Each daemon life's training seconds from its log: its committed steps, times each
    step's own time (:func:`own_time`), less the redone ones. A step is redone where the
    job had reached it before the last cold restart (a checkpoint load on any node, or a
    start over from step 1) that came before it: the rule the daemons count `discarded`
    by, whichever node trained the step the first time (a node stopped then does not
    train it the first time after the restart)."""
    commits: list[tuple[float, str, int, float]] = []  # (time, life, step, own seconds)
    loads: list[float] = []
    for name, events in histories:
        paused, prev = fenced(events), None
        for e in events:
            kind = e.get("event")
            if kind == "checkpoint_loaded":
                loads.append(event_time(e))
            if kind in RANK_STARTS:
                prev = None
            elif kind == "heal_done":
                prev = event_time(e)
            elif kind in STEP_ENDS_ALL:
                if kind in STEP_ENDS:
                    commits.append((event_time(e), name, int(e["step"]), own_time(e, prev, paused)))
                prev = event_time(e)
    commits.sort()
    times = [t for t, *_ in commits]
    reach = list(itertools.accumulate((s for _, _, s, _ in commits), max))  # by time

    def reached_before(t: float) -> int:
        i = bisect.bisect_left(times, t)
        return reach[i - 1] if i else 0

    # A step 1 after the job had gone further is a start over from nothing (no checkpoint
    # to load): a cold restart too.
    loads += [t for t, _, step, _ in commits if step == 1 and reached_before(t) > 1]
    loads.sort()
    trained: dict[str, float] = {name: 0.0 for name, _ in histories}
    for t, name, step, own in commits:
        last = bisect.bisect_right(loads, t)
        if not last or step > reached_before(loads[last - 1]):
            trained[name] += own
    return trained


# The incident each injected fault must come out as (tests/support/faults.py). A slow
# rank is none: a straggler is no failure (the job goes on at its pace).
EXPECTED: dict[str, str | None] = {
    "rank_kill": "rank_exit",
    "rank_stop": "hang",
    "slow_rank": None,
    "cold_restart": "rank_exit",  # every group's ranks killed: one record, a cold restart
    "corrupt_checkpoint": "checkpoint",
    "daemon_kill": "node_lost",
    "leader_kill": "leader_lost",
    "drain": "drain",
    "etcd_kill": "etcd_outage",
    "host_isolated": "partition",
    "etcd_cut": "partition",
}
# An incident's start is the daemons' clock and, for a lost daemon, its ranks' last
# heartbeat: it may come this much before the driver's note of the fault's start.
SLACK_S = 1.0


def incident_problems(faults: Sequence[Any], incidents: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each incident belongs to a fault whose time it began in, from the fault's start to
    the job whole again, SLACK_S either side (a lost daemon's ranks beat last just before
    the kill; a rank's exit may be seen just after the job counted whole, its standby
    already in): the one of its kind where two could hold it, else the last begun. Each
    fault must have exactly the incident of its kind (none for a slow rank), and every
    incident must belong to a fault."""
    ordered = sorted(faults, key=lambda f: f.started)
    judged = ordered
    if len(ordered) * 2 >= KEEP and incidents:
        # The record keeps the newest KEEP incidents: with this many faults (make soak)
        # the oldest may be gone, so only the faults all of whose incidents began after
        # the oldest kept are judged (one starting within SLACK_S of it may have lost a
        # node's record: soak seed 708768 lost a cold restart's, the others' were kept);
        # what is left of the others' incidents is homed, not judged.
        oldest = min(i["began"] for i in incidents)
        judged = [f for f in ordered if f.started - SLACK_S > oldest]
    found: dict[int, list[str]] = {id(f): [] for f in ordered}
    problems = []
    for i in incidents:
        held = [f for f in ordered if f.started - SLACK_S <= i["began"] <= f.whole + SLACK_S]
        alike = [f for f in held if EXPECTED[f.kind] == i["kind"]]
        home = (alike or held or [None])[-1]
        if home is None:
            problems.append(f"an incident with no fault: {i}")
            continue
        found[id(home)].append(i["kind"])
    for f in judged:
        want = [EXPECTED[f.kind]] if EXPECTED[f.kind] else []
        if found[id(f)] != want:
            problems.append(f"{f.line()}: incidents {found[id(f)]}, expected {want}")
    return problems
