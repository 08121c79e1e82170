"""Groups that span nodes, a while without a fault: does any node step aside, announce
a failure, revoke a seat or restart its group when nothing failed (issue 49)?

Two groups of two nodes each (``job.nodes_per_group = 2``, ``parallel.dp_shard = 2``),
every node a network namespace host (``tests.support.netns``), etcd on one more, every
setting at its default but the job's size, the ranks unpaced (said in the first line).
Once both groups commit together, the job runs ``--seconds`` (600) untouched; then the
bench counts, over that window, what a node does only on a failure: a step aside for a
member whose host answered nothing (``group_paused`` with that reason,
``daemon/supervision/aside.py``), ``failure_announced``, ``seat_revoked``,
``group_restarted`` and ``group_failed``, elections (``leader_elected``), and each
group's longest pause between commits. Run it beside the test suite to load the cores
(``make test`` in another checkout). Run as root: ``python -m bench.span_quiet
[--seconds 600] [--out FILE] [--keep DIR]``; it needs this checkout's virtual
environment (``make venv``) and leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.pacing import PACING_LINE
from bench.span_cluster import two_by_two
from bench.spare_takeover import longest_pause
from tests.support.harness import Daemon, event_time

FALSE = ("failure_announced", "seat_revoked", "group_restarted", "group_failed", "leader_elected")


def counts(daemons: list[Daemon], start: float, end: float) -> dict[str, int]:
    """How many of each failure-only event the daemons logged in [start, end]."""
    found = {name: 0 for name in ("stepped_aside", *FALSE)}
    for d in daemons:
        for e in d.events():
            if not start <= event_time(e) <= end:
                continue
            name = e.get("event")
            if name == "group_paused" and "answers nothing" in str(e.get("reason")):
                found["stepped_aside"] += 1
            elif name in FALSE:
                found[str(name)] += 1
    return found


def run(seconds: float, work: Path) -> dict[str, object]:
    with two_by_two(work) as cluster:
        daemons = cluster.daemons
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        alive = all(d.proc.popen.poll() is None for d in daemons)
        return {
            "seconds": round(end - start, 1),
            "every_daemon_alive": alive,
            "events": counts(daemons, start, end),
            "longest_pause_s": {
                str(g): round(longest_pause(daemons, g, start, end), 3) for g in (0, 1)
            },
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", type=Path, help="keep the daemons' logs in this new directory")
    args = parser.parse_args()
    print(PACING_LINE, flush=True)
    with tempfile.TemporaryDirectory(prefix="span-quiet-") as tmp:
        figures = run(args.seconds, (args.keep or Path(tmp)) / "span")
    print(json.dumps(figures, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
