"""A split inside a group that spans nodes, at the default settings: how long does the
other group pause, and how soon is the split group back once the cut heals (issue 49)?

Two groups of two nodes each, every node a network namespace host, etcd on one more,
every setting at its default but the job's size (so ``ft.timeout_s`` 30 s,
``lighthouse.heartbeat_timeout_ms`` 0.5 s, ``lighthouse.join_timeout_ms`` 10 s), the
ranks unpaced (said in the first line). Once both groups commit together, group 1's two
nodes are cut from each other (blackhole routes both ways; both still reach etcd and
group 0) for ``--cut-s`` (20), then healed, ``--repeats`` (3) times. Measured per cut:
group 0's longest pause between commits from the cut until group 1 is back, group 1's
first commit with group 0 after the heal, and what group 1's nodes did meanwhile (steps
aside, rank failures, restarts; ``daemon/supervision/aside.py`` holds a split out of the
other group's quorums). Run as root: ``python -m bench.span_split [--cut-s 20]
[--repeats 3] [--out FILE] [--keep DIR]``; it needs this checkout's virtual environment
(``make venv``) and leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.pacing import PACING_LINE
from bench.span_cluster import two_by_two
from bench.spare_takeover import longest_pause, together_after
from tests.support.harness import Daemon, event_time, wait_for
from tests.support.spanning_groups import seats

DURING = ("group_paused", "group_resumed", "rank_failed", "group_failed", "group_restarted")


def said(daemons: list[Daemon], start: float, end: float) -> dict[str, int]:
    """How many of each of :data:`DURING` the daemons logged in [start, end]."""
    found = dict.fromkeys(DURING, 0)
    for d in daemons:
        for e in d.events():
            if e.get("event") in found and start <= event_time(e) <= end:
                found[str(e["event"])] += 1
    return found


def run(cut_s: float, repeats: int, work: Path) -> list[dict[str, object]]:
    with two_by_two(work) as cluster:
        net, daemons = cluster.net, cluster.daemons
        held = seats(daemons)
        one = (cluster.host_of[held[(1, 0)].node_id], cluster.host_of[held[(1, 1)].node_id])
        rows: list[dict[str, object]] = []
        for repeat in range(repeats):
            time.sleep(5.0)
            cut = time.time()
            net.cut(*one)
            time.sleep(cut_s)
            net.heal(*one)
            healed = time.time()
            back = wait_for(partial(together_after, daemons, 1, healed), 300, "group 1 back")
            time.sleep(1.0)  # group 0's commits after group 1's return close its pause
            row: dict[str, object] = {
                "other_pause_s": round(longest_pause(daemons, 0, cut, back), 3),
                "back_after_heal_s": round(back - healed, 3),
                "during_cut": said([held[(1, 0)], held[(1, 1)]], cut, healed),
            }
            rows.append(row)
            print(f"  cut {repeat + 1}: {json.dumps(row)}", flush=True)
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cut-s", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", type=Path, help="keep the daemons' logs in this new directory")
    args = parser.parse_args()
    print(PACING_LINE, flush=True)
    print(f"group 1's two nodes cut from each other for {args.cut_s:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="span-split-") as tmp:
        rows = run(args.cut_s, args.repeats, (args.keep or Path(tmp)) / "split")
    for key, what in (
        ("other_pause_s", "group 0's longest pause"),
        ("back_after_heal_s", "group 1 back after the heal"),
    ):
        figures = [float(str(r[key])) for r in rows]
        print(
            f"{what}: {min(figures):.2f} / {statistics.median(figures):.2f} / "
            f"{max(figures):.2f} s (min / median / max)"
        )
    if args.out is not None:
        args.out.write_text(json.dumps({"cut_s": args.cut_s, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
