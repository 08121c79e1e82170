"""A rank SIGKILLed at every ring position, with and without failure announcements (issue 49).

N daemons on this machine (one rank each, a standby each) share one etcd on loopback and
train one job with every setting at its default but the job's size; nothing paces the
ranks (``PHALANX_CHAOS_DELAY=0``). Once all N commit a step together, the rank of the
group in slot p (ring position p: torchft orders a quorum by replica id) is SIGKILLed,
for p = 0 .. N-1 in turn, ``--repeats`` rounds (3 by default). Before each kill it waits
for the victim's standby to have warmed, as a job's have long before its first failure
(the wait is in each row; ``--cold`` kills without it). For each kill it records the
survivors' longest pause between committed steps that spans the kill, the killed
group's time from the kill to its first commit after the restart (and to its restart,
its new rank's start and its heal, and whether its standby had warmed before the kill),
and how many quorums waited out ``lighthouse.join_timeout_ms``.

Each group count runs twice in the same invocation: with ``node.announce_failures``
(the default) and without it (the job as it was), and the table gives the ratio of the
medians. ``--nproc 2`` gives each node two ranks (``parallel.dp_shard = 2``, a standby
each) and kills one of them; ``--announce on`` runs the default only. Run: ``python -m
bench.ring_failover [--groups 2 3 4] [--repeats 3] [--nproc 1] [--announce both]
[--cold] [--json FILE]`` (it needs this checkout's virtual environment, ``make venv``, and
leaves nothing running).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pacing import UNPACED
from bench.pauses import longest_gap, settled
from daemon.coordination.etcd_server import EmbeddedEtcd
from tests.support.harness import (
    Daemon,
    event_time,
    job_groups,
    start_daemon,
    wait_for,
)

JOB = """\
# bench/ring_failover.py: every setting at its default but the job's size.
[job]
name = "itest"
max_replicas = {groups}

[train]
steps = 1000000
{parallel}"""


def commit_times(d: Daemon) -> list[float]:
    return [event_time(e) for e in d.events("train_step")]


def together(daemons: list[Daemon], n: int, after: float) -> bool:
    return all(
        any(e["participants"] == n and event_time(e) > after for e in d.events("train_step"))
        for d in daemons
    )


def pause_over(times: list[float], t: float) -> float:
    """The longest gap between consecutive commits among those that end after `t` and
    begin no later than the steps are back to normal (bench/pauses.py:settled): the pause
    the kill at `t` caused."""
    return longest_gap(times, t, settled(times, t) + 1e-9)[0]


def restart_phases(victim: Daemon, killed_at: float) -> dict[str, Any]:
    """Where the killed group's way back went: seconds from the kill to its restart, its
    new rank's start and its heal, and whether the standby it started from had finished
    warming (importing torch at idle priority) before the kill."""

    def first_after(name: str) -> dict[str, Any] | None:
        return next((e for e in victim.events(name) if event_time(e) >= killed_at), None)

    restarted, started, healed = (
        first_after(n) for n in ("group_restarted", "rank_started", "heal_done")
    )
    ready_at = {e.get("pid"): event_time(e) for e in victim.events("standby_ready")}
    pids = (restarted or {}).get("pids") or []
    warm = bool(pids) and all(ready_at.get(p, float("inf")) < killed_at for p in pids)

    def since(e: dict[str, Any] | None) -> float | None:
        return None if e is None else round(event_time(e) - killed_at, 3)

    return {
        "restarted_s": since(restarted),
        "rank_started_s": since(started),
        "healed_s": since(healed),
        "standby_warm_at_kill": warm,
    }


def warm_standbys(d: Daemon, count: int, timeout: float) -> None:
    """Wait until `count` of `d`'s standbys have said standby_ready (one per rank)."""

    def ready() -> bool:
        pids = (d.status() or {}).get("standby_pids") or []
        said = {e.get("pid") for e in d.events("standby_ready")}
        return sum(p in said for p in pids) >= count

    wait_for(ready, timeout, f"{count} ready standbys on {d.node_id}")


def run(
    groups: int,
    announce: bool,
    work: Path,
    warm_first: bool = True,
    repeats: int = 1,
    nproc: int = 1,
) -> list[dict[str, Any]]:
    """One cluster of `groups` daemons of `nproc` ranks each (``parallel.dp_shard``):
    `repeats` rounds of a kill of one rank at every ring position; a row per kill."""
    work.mkdir(parents=True)
    job = work / "job.toml"
    parallel = f"\n[parallel]\ndp_shard = {nproc}\n" if nproc > 1 else ""
    job.write_text(JOB.format(groups=groups, parallel=parallel))
    etcd = EmbeddedEtcd(work / "etcd")
    etcd.start()
    daemons: list[Daemon] = []
    rows: list[dict[str, Any]] = []
    try:
        setting = [f"node.announce_failures={'true' if announce else 'false'}"]
        setting += [f"node.nproc={nproc}"] if nproc > 1 else []
        daemons = [
            start_daemon(
                work, f"node-{i}", [etcd.endpoint], config=job, overrides=setting,
                env=UNPACED,
            )
            for i in range(groups)
        ]  # fmt: skip
        wait_for(lambda: together(daemons, groups, 0.0), 300, "every group to train together")
        slots = job_groups(etcd.endpoint)
        by_node = {d.node_id: d for d in daemons}
        ready = time.time()
        for repeat, position in itertools.product(range(repeats), range(groups)):
            wait_for(functools.partial(together, daemons, groups, ready), 120, "all together")
            victim = by_node[slots[position]]
            # A job's standbys are warm long before its first failure; here the kills
            # follow the start, so wait for the victim's (warming at idle priority
            # beside unpaced ranks on two cores takes tens of seconds) and say so.
            waited = time.time()
            if warm_first:
                warm_standbys(victim, nproc, 300)
            standby_wait_s = round(time.time() - waited, 1)
            killed_at = time.time()
            os.kill(victim.rank_pids()[0], signal.SIGKILL)
            back_together = functools.partial(together, daemons, groups, killed_at + 1.0)
            wait_for(back_together, 180, "all groups back together")
            ready = time.time()
            survivors = [d for d in daemons if d is not victim]
            phases = restart_phases(victim, killed_at)
            # The rank may commit once more between the clock read and the signal: the
            # group is back at its first commit after the daemon restarted it.
            restarted_at = killed_at + (phases["restarted_s"] or 0.0)
            back = [t for t in commit_times(victim) if t > restarted_at]
            rows.append(
                {
                    "groups": groups,
                    "nproc": nproc,
                    "announce": announce,
                    "position": position,
                    "repeat": repeat,
                    "survivors_longest_pause_s": round(
                        max(pause_over(commit_times(d), killed_at) for d in survivors), 3
                    ),
                    "killed_group_commits_again_s": round(back[0] - killed_at, 3),
                    **phases,
                    "standby_wait_s": standby_wait_s,
                    "join_timeouts": sum(
                        1
                        for d in daemons
                        for e in d.events("quorum_join_timeout")
                        if event_time(e) > killed_at
                    ),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for d in daemons:
            d.stop()
        etcd.stop()
    return rows


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def report(rows: list[dict[str, Any]]) -> None:
    print(f"\nranks per node: {sorted({r.get('nproc', 1) for r in rows})}")
    print("| groups | announcements | survivors' longest pause min/med/max s | "
          "killed group commits again s | its standby warm at the kill | "
          "quorums that waited out the join |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for n in sorted({r["groups"] for r in rows}):
        medians = {}
        for announce in (True, False):
            mine = [r for r in rows if r["groups"] == n and r["announce"] == announce]
            if not mine:
                continue
            pauses = [r["survivors_longest_pause_s"] for r in mine]
            medians[announce] = statistics.median(pauses)
            back = [r["killed_group_commits_again_s"] for r in mine]
            joins = sum(r["join_timeouts"] for r in mine)
            warm = f"{sum(bool(r.get('standby_warm_at_kill')) for r in mine)} of {len(mine)}"
            label = "on (default)" if announce else "off"
            print(f"| {n} | {label} | {spread(pauses)} | {spread(back)} | {warm} | {joins} |")
        if len(medians) == 2 and medians[True] > 0:
            ratio = medians[False] / medians[True]
            print(f"| {n} | off/on pause ratio | {ratio:.1f}x | | | |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of kills per cluster")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="kill without waiting for the victim's standby to finish warming",
    )
    parser.add_argument("--nproc", type=int, default=1, help="ranks per node (dp_shard)")
    parser.add_argument(
        "--announce",
        choices=("both", "on", "off"),
        default="both",
        help="run with failure announcements, without, or both (the default)",
    )
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    settings = {"both": (True, False), "on": (True,), "off": (False,)}[args.announce]
    with tempfile.TemporaryDirectory(prefix="phalanx-ring-") as tmp:
        for n in args.groups:
            for announce in settings:
                work = Path(tmp) / f"{n}-{announce}"
                rows += run(n, announce, work, not args.cold, args.repeats, args.nproc)
    report(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
