"""What must hold after a run of random faults (tests/support/faults.py), read from the
logs of every life of every daemon: no committed step lost, no job-wide pause beyond a
fault's bound, every log line structured, nothing left running."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import NamedTuple

from tests.support.faults import COLD, Cluster, Fault
from tests.support.harness import Event, event_time

# The longest job-wide pause between two commits (any group's) each fault may cause with
# these runs' settings (tests/support/faults.py OVERRIDES; lease TTL 4 s, lighthouse
# heartbeat timeout 2 s, ft.timeout_s 8 s), and docs/failure-modes.md, "Random faults".
# A held fault adds its hold.
BOUNDS_S = {
    "rank_kill": 6.0,  # the lighthouse drops the dead replica (2 s), a standby heals
    "rank_stop": 15.0,  # the peers' collective times out (ft.timeout_s), then as a kill
    "slow_rank": 3.0,  # steps slow, never stop
    "cold_restart": 30.0,  # every group restarts and loads the checkpoint
    "corrupt_checkpoint": 30.0,
    "daemon_kill": 8.0,  # its ranks die with it: as a rank kill, the seat frees later
    "leader_kill": 12.0,  # leader lease (1 s), a new lighthouse, the quorum again
    "drain": 8.0,
    "etcd_kill": 12.0,  # a long outage fences every node: the outage, then unfencing
    "host_isolated": 15.0,  # the collective with it times out; a new leader if it led
    "etcd_cut": 15.0,  # it fences itself; its peers' collective times out
}
QUIET_S = 5.0  # the longest pause while no fault is under way
SLACK_S = 2.0  # a fault's window, widened: its effect may show a little before it ends
QUIET_EVENTS = ("rank_output", "library_log")  # a timeline leaves them out


def commits(c: Cluster) -> list[tuple[float, int, str]]:
    """Every committed step of every group: (time, step, node), in time order."""
    out = [
        (event_time(e), int(e["step"]), d.node_id)
        for d in c.every_life()
        for e in d.events("train_step")
    ]
    return sorted(out)


PARTITIONS = ("host_isolated", "etcd_cut")  # a node cut off: it may train on alone a while


def losing_sides(c: Cluster, faults: list[Fault]) -> list[tuple[str, float, float]]:
    """(node, from, to): the steps a node cut off by a partition committed from the cut
    until it judged them lost (``fence_discarding``). A cut-off leader's group may go on
    alone until its fence (DESIGN.md, "Partitions", rule 4) while the others elect a
    leader and go on; its steps never survive: it logs the discard and its ranks
    restart and heal from the majority. Only a discard the node logged in the fault's
    window makes a losing side."""
    sides = []
    for f in faults:
        if f.kind not in PARTITIONS:
            continue
        node = f"node-{f.node}"
        discards = [
            event_time(e)
            for d in c.every_life()
            if d.node_id == node
            for e in d.events("fence_discarding")
            if f.started <= event_time(e) <= f.whole + SLACK_S
        ]
        if discards:
            sides.append((node, f.started, min(discards)))
    return sides


def job_commits(c: Cluster, faults: list[Fault]) -> list[tuple[float, int, str]]:
    """`commits`, less those a partition's losing side made (`losing_sides`)."""
    losing = losing_sides(c, faults)
    return [
        (t, step, node)
        for t, step, node in commits(c)
        if not any(n == node and a <= t <= b for n, a, b in losing)
    ]


class Lost(NamedTuple):
    """A commit below the job's top step, outside any window that explains it."""

    t: float
    node: str
    step: int
    top: int

    def __str__(self) -> str:
        return f"{self.node} committed step {self.step} at {self.t:.1f} after step {self.top}"


def lost_steps(c: Cluster, faults: list[Fault]) -> list[Lost]:
    """Committed steps never go back, except to a checkpoint in a cold restart's window
    (within two steps: groups log the same commit a moment apart). Steps a partition's
    losing side committed (`losing_sides`) are not the job's: they are left out here,
    and `healed_from_losing_side` checks that no group ever took them."""
    cold = [(f.started, f.whole + SLACK_S) for f in faults if f.kind in COLD]
    problems: list[Lost] = []
    top = -1
    for t, step, node in job_commits(c, faults):
        if step < top - 2:
            if any(a <= t <= b for a, b in cold):
                top = step
                continue
            problems.append(Lost(t, node, step, top))
        top = max(top, step)
    return problems


def healed_from_losing_side(c: Cluster, faults: list[Fault]) -> list[str]:
    """Heals, at any time, to a step that no group outside a losing side had committed by
    then: the cut-off side's history winning over the majority's."""
    kept = job_commits(c, faults)
    problems = []
    for d in c.every_life():
        for e in d.events("heal_done"):
            t, step = event_time(e), int(e["step"])
            known = max((s for ts, s, _ in kept if ts <= t + 1.0), default=-1)
            if step > known + 1:
                problems.append(
                    f"{d.node_id} healed to step {step} at {t:.1f}; the majority had {known}"
                )
    return problems


def long_pauses(c: Cluster, faults: list[Fault], start: float) -> list[str]:
    """Job-wide pauses (no group commits) beyond the bound of the faults under way."""
    times = [t for t, _, _ in commits(c) if t >= start]
    problems: list[str] = []
    for a, b in itertools.pairwise(times):
        gap = b - a
        if gap <= QUIET_S:
            continue
        during = [f for f in faults if f.started - SLACK_S <= b and a <= f.whole + SLACK_S]
        bound = max((BOUNDS_S[f.kind] + f.hold_s for f in during), default=QUIET_S)
        if gap > bound:
            names = ", ".join(f.line() for f in during) or "no fault"
            problems.append(f"no commit for {gap:.1f}s from {a:.1f} ({names}; bound {bound:.0f}s)")
    return problems


def _commit_run(name: str, run: list[Event]) -> tuple[float, str, str]:
    first, last = run[0], run[-1]
    parts = ",".join(sorted({str(e.get("participants")) for e in run}))
    text = f"steps {first['step']}..{last['step']} (participants {parts}) to {event_time(last):.1f}"
    return event_time(first), name, text


def timeline(c: Cluster, t: float, span_s: float = 5.0, limit: int = 80) -> str:
    """What every life of every daemon logged from `span_s` before `t` to `span_s` after,
    a run of commits on one line: enough to tell a failure's story from CI's output."""
    rows: list[tuple[float, str, str]] = []
    lives: dict[str, int] = {}
    for d in c.every_life():
        lives[d.node_id] = lives.get(d.node_id, -1) + 1
        name = f"{d.node_id}.{lives[d.node_id]}"  # as its log file is named
        run: list[Event] = []
        for e in d.events():
            when = event_time(e)
            if not t - span_s <= when <= t + span_s or e.get("event") in QUIET_EVENTS:
                continue
            if e.get("event") == "train_step":
                if e.get("rank", 0) == 0:
                    run.append(e)
                continue
            if run:
                rows.append(_commit_run(name, run))
                run = []
            extra = {
                k: v for k, v in e.items() if k not in ("event", "time", "level", "node", "job")
            }
            rows.append((when, name, f"{e.get('event')} {json.dumps(extra)[:160]}"))
        if run:
            rows.append(_commit_run(name, run))
    rows.sort()
    lines = [f"{when:.1f} {name:10s} {text}" for when, name, text in rows]
    cut = f"\n... {len(lines) - limit} more" if len(lines) > limit else ""
    return f"what the daemons logged around {t:.1f}:\n" + "\n".join(lines[:limit]) + cut


def longest_pause(c: Cluster, f: Fault) -> float:
    """The longest job-wide pause that began during `f`'s window."""
    times = [t for t, _, _ in commits(c)]
    gaps = [b - a for a, b in itertools.pairwise(times) if f.started - 1 <= a <= f.whole]
    return max(gaps, default=0.0)


def unstructured_lines(c: Cluster) -> list[str]:
    """Lines of the daemons' output that are not one JSON event each."""
    problems: list[str] = []
    for d in c.every_life():
        for path in (d.proc.stdout, d.proc.stderr):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    event: Event = json.loads(line)
                    if isinstance(event, dict) and "event" in event:
                        continue
                except ValueError:
                    pass
                problems.append(f"{path.name}:{n}: {line[:200]}")
    return problems


def left_running(root: Path, but: tuple[int, ...] = ()) -> list[str]:
    """Processes whose command line or environment names the run's directory (daemons,
    etcd, and ranks, standbys and zygotes, whose heartbeat file lies in it)."""
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in but:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline or str(root) in environ:
            found.append(f"{proc.name}: {cmdline[:160]}")
    return found
