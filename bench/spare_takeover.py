"""A spare node takes a lost node's seat: a group of two nodes against a group of one (issue 37).

Two layouts of the same job run one after the other, every setting at its default but
the job's size (so the node lease's TTL, 10 s, is the default one):

* **one** node per group: two groups and a spare, three hosts;
* **two** nodes per group (``job.nodes_per_group = 2``, ``parallel.dp_shard = 2``):
  two groups and a spare, five hosts.

Each host is a network namespace (``tests.support.netns``), etcd on one more. Once both
groups commit together, a node of group 1 (for two, its second node) is SIGKILLed with
its ranks; the spare takes its seat: with one node per group once the node's lease
lapses, with two as soon as the group's other node revokes the silent one's seat
(``daemon/supervision/seat_probe.py``). Measured: kill to group 1 committing together
with group 0 from ranks started after the kill, and group 0's longest pause between
commits over the takeover. A fresh daemon on the killed node's host is the next
repeat's spare. Prints min/median/max per layout and the ratio of the medians (the
issue's target: two nodes within 2x one). Nothing paces the ranks
(``PHALANX_CHAOS_DELAY=0``, said in the output's first line).

``--power-off`` also cuts the victim's host off from everything at the kill, so
that nothing there answers, as after a power loss (without it the host's kernel refuses
connections to the dead daemon's ports). Run as root: ``python -m bench.spare_takeover
[--repeats 3] [--power-off] [--out FILE] [--keep DIR]``, FILE getting the raw figures as
JSON, DIR the daemons' logs. It needs this checkout's
virtual environment (``make venv``) and leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.pacing import PACING_LINE, UNPACED
from bench.pauses import longest_gap
from tests.support.harness import Daemon, Proc, event_time, ready_standby, start_daemon, wait_for
from tests.support.multihost import etcd_on
from tests.support.netns import Host, Network
from tests.support.spanning_groups import seats

JOB = """\
# bench/spare_takeover.py: every setting at its default but the job's size.
[job]
name = "spare"
max_replicas = 2
nodes_per_group = {nodes}

[parallel]
dp_shard = {nodes}

[train]
steps = 1000000
"""


def seat_of(d: Daemon) -> tuple[int, int] | None:
    doc = d.status()
    if doc is None or doc.get("replica_group") is None:
        return None
    return int(doc["replica_group"]), int(doc["node_rank"])


def is_spare(d: Daemon) -> bool:
    return bool((d.status() or {}).get("spare"))


def together_after(daemons: list[Daemon], group: int, after: float) -> float | None:
    """When a node of `group` first committed a step with both groups after `after`."""
    times = [
        event_time(e)
        for d in daemons
        for e in d.events("train_step")
        if e.get("replica_group") == group and e.get("participants") == 2
        and event_time(e) > after
    ]  # fmt: skip
    return min(times) if times else None


def holder(daemons: list[Daemon], seat: tuple[int, int]) -> Daemon | None:
    """The live daemon in `seat` (group, node rank), if any."""
    return seats([d for d in daemons if d.proc.popen.poll() is None]).get(seat)


def started_after(daemons: list[Daemon], group: int, after: float) -> float | None:
    """When a node of `group` first started (or restarted) its ranks after `after`."""
    times = [
        event_time(e)
        for d in daemons
        for name in ("group_started", "group_restarted")
        for e in d.events(name)
        if e.get("replica_group", e.get("slot")) == group and event_time(e) > after
    ]
    return min(times) if times else None


def longest_pause(daemons: list[Daemon], group: int, start: float, end: float) -> float:
    """The longest gap between consecutive commits of `group` that one daemon logged,
    among those that end after `start` and begin before `end`."""
    return max(
        longest_gap(
            [event_time(e) for e in d.events("train_step") if e.get("replica_group") == group],
            start,
            end,
        )[0]
        for d in daemons
    )


def layout(nodes: int, repeats: int, work: Path, power_off: bool = False) -> list[dict[str, float]]:
    """Kill-to-commit times (and group 0's longest pause) of `repeats` spare takeovers
    with `nodes` nodes per group; with `power_off` the victim's host is cut off from
    everything as its daemon and ranks are killed (nothing on it answers, as after a
    power loss), and joins again only to host the next spare."""
    config = work / "job.toml"
    work.mkdir(parents=True)
    config.write_text(JOB.format(nodes=nodes))
    net = Network()
    daemons: list[Daemon] = []
    etcd = None
    try:
        etcd_host = net.add_host("etcd")
        hosts = [net.add_host(f"h{i}") for i in range(2 * nodes + 1)]
        etcd = etcd_on(etcd_host, work)
        endpoints = [f"{etcd_host.address}:2379"]
        by_id: dict[str, Host] = {}

        def start(host: Host, name: str) -> Daemon:
            d = start_daemon(work, name, endpoints, config=config, host=host, env=UNPACED)
            by_id[name] = host
            daemons.append(d)
            return d

        for i, host in enumerate(hosts[:-1]):
            start(host, f"node-{i}")
        wait_for(lambda: together_after(daemons, 1, 0.0), 300, "both groups to commit together")
        spare = start(hosts[-1], "spare-0")
        wait_for(partial(is_spare, spare), 120, "the spare")
        figures = []
        group_one = {(1, r) for r in range(nodes)}
        for repeat in range(repeats):
            victim = wait_for(
                partial(holder, daemons, (1, nodes - 1)), 120, f"a node in seat (1, {nodes - 1})"
            )
            # A job's standbys are warm long before a node is lost; here, with every core
            # busy, a standby at idle priority takes 10-45 s to warm, so the kill waits
            # for those of the group's nodes and the spare (the row gives the wait).
            waited = time.time()
            for d in daemons:
                if d.proc.popen.poll() is None and (d is spare or seat_of(d) in group_one):
                    ready_standby(d, 300)
            standby_wait_s = round(time.time() - waited, 1)
            killed = time.time()
            if power_off:
                net.isolate(by_id[victim.node_id])
            victim.stop()
            # Group 1's first commit with group 0 from ranks started after the kill (its
            # other node may log a step committed just before the kill reached it).
            started = wait_for(
                partial(started_after, daemons, 1, killed), 300, "group 1 to start again"
            )
            back = wait_for(
                partial(together_after, daemons, 1, started), 300, "group 1 to commit again"
            )
            time.sleep(1.0)  # group 0's commits after group 1's return close its pause
            pause = longest_pause(daemons, 0, killed, back)
            figures.append(
                {
                    "kill_to_commit_s": round(back - killed, 3),
                    "other_pause_s": round(pause, 3),
                    "standby_wait_s": standby_wait_s,
                }
            )
            print(
                f"  {nodes} node(s) per group, repeat {repeat + 1}: {back - killed:.2f} s, "
                f"group 0's longest pause {pause:.2f} s (standbys warm after {standby_wait_s} s)"
            )
            if power_off:
                net.rejoin(by_id[victim.node_id])
            if repeat + 1 < repeats:  # the killed host's fresh daemon is the next spare
                spare = start(by_id[victim.node_id], f"spare-{repeat + 1}")
                wait_for(partial(is_spare, spare), 120, "a new spare")
                time.sleep(5.0)  # let the last heal settle before the next kill
        return figures
    finally:
        tear_down(daemons, etcd, net)


def tear_down(daemons: list[Daemon], etcd: Proc | None, net: Network) -> None:
    """Stop every daemon, then etcd, then take the hosts down."""
    for d in daemons:
        d.stop()
    if etcd is not None:
        etcd.stop()
    net.close()


def spread(rows: list[dict[str, float]], key: str) -> str:
    figures = [r[key] for r in rows]
    return f"{min(figures):.2f} / {statistics.median(figures):.2f} / {max(figures):.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the raw figures to this JSON file")
    parser.add_argument("--keep", type=Path, help="keep the daemons' logs in this new directory")
    parser.add_argument(
        "--power-off",
        action="store_true",
        help="cut the victim's host off from everything as it is killed (a power loss)",
    )
    args = parser.parse_args()
    print(PACING_LINE, flush=True)
    kill = "host cut off and its daemon killed" if args.power_off else "daemon and ranks killed"
    print(f"the lost node: {kill}", flush=True)
    with tempfile.TemporaryDirectory(prefix="spare-takeover-") as tmp:
        root = args.keep or Path(tmp)
        one = layout(1, args.repeats, root / "one", args.power_off)
        two = layout(2, args.repeats, root / "two", args.power_off)
    for key, what in (
        ("kill_to_commit_s", "kill to the group committing again with a spare"),
        ("other_pause_s", "the other group's longest pause"),
    ):
        print(f"{what} (min / median / max):")
        print(f"  one node per group:  {spread(one, key)}")
        print(f"  two nodes per group: {spread(two, key)}")
    medians = [statistics.median(r["kill_to_commit_s"] for r in rows) for rows in (one, two)]
    print(f"  ratio of medians, kill to commit (two / one): {medians[1] / medians[0]:.2f}")
    if args.out is not None:
        figures = {"one": one, "two": two, "power_off": args.power_off}
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
