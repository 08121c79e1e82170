"""Leader loss, host loss and a cold standby on three hosts, with the default settings (issue 36).

Three daemons, each on a host of its own (a network namespace, ``tests.support.netns``),
and etcd on a fourth, train one job with every setting at its default (the job file
below sets only the job's size). The same cluster then meets, ``--repeats`` times:

(a) the leader host's daemon and ranks SIGKILLed (a replacement daemon starts on the
    same host and run directory once the others train on);
(b) the leader's host cut off from everything for ``--cut-s`` seconds;
(c) a non-leader host power-cycled: its daemon and ranks SIGKILLed, its link down for
    ``--off-s`` seconds, then a fresh daemon started;
(d) right after (c), that node's rank SIGKILLed while its first standby still warms;
(e) etcd paused (SIGSTOP) for ``--etcd-pause-s`` seconds, less than the node lease's fence.

``--quiet-s`` first runs that long without a fault: an election then is a false takeover.

For each it prints the survivors' longest pause between commits (a pause that spans
the fault), the time to a new leader, the time until every live group commits again,
and for (c) the restarted node's daemon-start-to-first-commit; min/median/max over
the repeats, and how many groups that were not hit announced a failure of their own
(``failure_announced``: in the quiet run any is false). Nothing paces the ranks
(``PHALANX_CHAOS_DELAY=0``, said in the output's first line): they step as fast as the
job lets them. Run as root (namespaces): ``python -m bench.failover [--repeats 3]
[--out FILE]``, FILE getting the raw rows as JSON.
It needs this checkout's virtual environment (``make venv``) and leaves nothing
running. The hosts and the daemon launcher are the multi-host tests' own.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.failover_report import Fault, measure, report
from bench.pacing import PACING_LINE, UNPACED
from tests.support.harness import Daemon, event_time, start_daemon, wait_for
from tests.support.multihost import etcd_on
from tests.support.netns import Host, Network

JOB = """\
# bench/failover.py: every setting at its default but the job's size.
[job]
name = "failover"
max_replicas = 3

[train]
steps = 1000000
"""


SETTLE_S = 5.0  # between faults: each one's figures end where the next begins


class Cluster:
    """etcd and three daemons on hosts of their own; daemons restarted on their host."""

    def __init__(self, net: Network, work: Path) -> None:
        self.net, self.work = net, work
        self.job = work / "job.toml"
        self.job.write_text(JOB)
        etcd_host = net.add_host("etcd")
        self.etcd = etcd_on(etcd_host, work)
        self.endpoint = f"{etcd_host.address}:2379"
        self.hosts = {n: net.add_host(n) for n in ("a", "b", "c")}
        self.daemons: dict[str, Daemon] = {}
        self.starts = {n: 0 for n in self.hosts}
        for name in self.hosts:
            self.start(name)
        self.wait_all_train(0.0, 240)

    def start(self, name: str) -> Daemon:
        self.starts[name] += 1
        d = start_daemon(
            self.work,
            f"node-{name}",
            [self.endpoint],
            config=self.job,
            host=self.hosts[name],
            name=f"node-{name}-{self.starts[name]}",
            env=UNPACED,
        )
        self.daemons[name] = d
        return d

    def leader(self) -> str:
        for name, d in self.daemons.items():
            doc = d.status()
            if doc and doc.get("leader"):
                return name
        raise RuntimeError("no daemon says it leads")

    def wait_all_train(self, after: float, timeout: float) -> None:
        """Until every daemon committed a step of three participants after `after`."""
        wait_for(
            lambda: all(
                any(
                    e.get("participants") == 3 and event_time(e) > after
                    for e in d.events("train_step")
                )
                for d in self.daemons.values()
            ),
            timeout,
            "all three groups to commit a step together",
        )

    def kill(self, name: str) -> None:
        """SIGKILL the daemon and its ranks (found from its status, not by name)."""
        d = self.daemons[name]
        pids = d.rank_pids()
        os.kill(d.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.wait(30)

    def close(self) -> None:
        for d in self.daemons.values():
            d.stop()
        self.etcd.stop()


def leader_killed(c: Cluster) -> Fault:
    name = c.leader()
    at = time.time()
    c.kill(name)
    others = [d for n, d in c.daemons.items() if n != name]
    wait_for(
        lambda: all(_committed_since(d, at + 0.5) for d in others), 60, "the others to train on"
    )
    time.sleep(3.0)
    fault = Fault("a: leader host SIGKILLed", at, others, until=time.time())
    c.start(name)
    c.wait_all_train(time.time(), 180)
    return fault


def leader_cut(c: Cluster, hold_s: float) -> Fault:
    name = c.leader()
    host: Host = c.hosts[name]
    at = time.time()
    c.net.isolate(host)
    try:
        time.sleep(hold_s)
    finally:
        c.net.rejoin(host)
    back = time.time()
    others = [d for n, d in c.daemons.items() if n != name]
    c.wait_all_train(time.time(), 180)
    return Fault("b: leader host cut off", at, others, until=back)


def follower_power_cycled(c: Cluster, off_s: float) -> tuple[Fault, Fault | None]:
    leader = c.leader()
    name = next(n for n in c.daemons if n != leader)
    host = c.hosts[name]
    at = time.time()
    c.kill(name)
    c.net.isolate(host)
    time.sleep(off_s)
    c.net.rejoin(host)
    others = [d for n, d in c.daemons.items() if n != name]
    booted = c.start(name)
    started = time.time()
    first = wait_for(lambda: booted.events("train_step"), 180, "the restarted node to commit")
    fault = Fault(
        "c: follower host power-cycled", at, others, until=started, restarted=(started, first[0])
    )
    cold = None
    if not any(e.get("standby") for e in booted.events("standby_ready")):  # none warm yet
        pids = booted.rank_pids()
        if pids:
            cold_at = time.time()
            os.kill(pids[0], signal.SIGKILL)
            cold = Fault("d: rank killed while its standby warms", cold_at, others, group=booted)
    c.wait_all_train(time.time(), 180)
    return fault, cold


def etcd_paused(c: Cluster, pause_s: float) -> Fault:
    """etcd stopped (SIGSTOP) for `pause_s`, shorter than the node lease's fence: nothing
    may pause, no leader may change hands, no group may restart."""
    at = time.time()
    os.kill(c.etcd.pid, signal.SIGSTOP)
    try:
        time.sleep(pause_s)
    finally:
        os.kill(c.etcd.pid, signal.SIGCONT)
    time.sleep(5.0)
    return Fault(f"e: etcd paused {pause_s:g} s", at, list(c.daemons.values()), until=time.time())


def quiet(c: Cluster, seconds: float) -> Fault:
    """No fault for `seconds`: any election meanwhile is a false takeover."""
    at = time.time()
    time.sleep(seconds)
    return Fault(
        f"q: {seconds:g} s without a fault", at, list(c.daemons.values()), until=time.time()
    )


def _committed_since(d: Daemon, t: float) -> bool:
    return any(event_time(e) > t for e in d.events("train_step"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cut-s", type=float, default=20.0)
    p.add_argument("--off-s", type=float, default=3.0)
    p.add_argument("--etcd-pause-s", type=float, default=5.0, help="0: no etcd pause")
    p.add_argument("--faults", default="abce", help="which of a b c e to run (d follows c)")
    p.add_argument(
        "--quiet-s", type=float, default=0.0, help="first, this long without a fault (0: none)"
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--out", type=Path, help="also write the raw rows to this JSON file")
    p.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    args = p.parse_args(argv)
    print(PACING_LINE, flush=True)
    work = Path(tempfile.mkdtemp(prefix="phalanx-failover-"))
    net = Network()
    faults: list[Fault] = []
    c: Cluster | None = None
    try:
        c = Cluster(net, work)
        if args.quiet_s:
            faults.append(quiet(c, args.quiet_s))
        for _ in range(args.repeats):
            if "a" in args.faults:
                faults.append(leader_killed(c))
                time.sleep(SETTLE_S)
            if "b" in args.faults:
                faults.append(leader_cut(c, args.cut_s))
                time.sleep(SETTLE_S)
            if "c" in args.faults:
                power, cold = follower_power_cycled(c, args.off_s)
                faults.append(power)
                if cold is not None:
                    faults.append(cold)
                time.sleep(SETTLE_S)
            if "e" in args.faults and args.etcd_pause_s:
                faults.append(etcd_paused(c, args.etcd_pause_s))
                time.sleep(SETTLE_S)
    finally:
        if c is not None:
            c.close()
        net.close()
    for f, after in itertools.pairwise(faults):
        f.next_at = after.at
    rows = [measure(f) for f in faults]
    print(json.dumps(rows, indent=1) if args.json else report(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    if args.keep:
        print(f"logs: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
