"""Random faults against three daemons on three network-namespace hosts, with etcd on a
fourth (issue 38): the schedule a seed draws, the cluster, and each fault's injection.

A fault is injected, then the driver waits until the job is whole again (every node's
group committed a step with all three in the quorum) before the next; the invariants
are checked afterwards from the logs (tests/support/fault_checks.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.harness import (
    HOLD_PACE_S,
    PACE_S,
    Daemon,
    Proc,
    event_time,
    start_daemon,
    wait_for,
)
from tests.support.multihost import etcd_on
from tests.support.netns import Host, Network

NODES = ("a", "b", "c")
KINDS = (
    "rank_kill", "rank_stop", "slow_rank", "cold_restart", "corrupt_checkpoint",
    "daemon_kill", "leader_kill", "drain", "etcd_kill", "host_isolated", "etcd_cut",
)  # fmt: skip
COLD = ("cold_restart", "corrupt_checkpoint")  # every group restarts from a checkpoint
HELD = {  # kinds held for a while: the range of seconds a seed draws from
    "slow_rank": (3.0, 6.0),
    "etcd_kill": (1.0, 4.0),
    "host_isolated": (4.0, 7.0),
    "etcd_cut": (4.0, 7.0),
}
# The job's settings for these runs (with tests/integration/daemon_job.toml): a silent
# peer (a cut, a stopped rank) fails a collective only by ft.timeout_s.
OVERRIDES = [
    "job.max_replicas=3",
    "ft.timeout_s=8",
    "ft.quorum_timeout_s=30",
    "hang.margin_s=2",
    "checkpoint.interval_steps=50",
    "node.max_restarts=1000",  # faults, not a crash loop: every restart is one we caused
    "node.standby=true",  # the default users get (the tests' job file turns it off)
]
WHOLE_TIMEOUT_S = 120.0  # a job not whole again this long after a fault stood still


@dataclass
class Fault:
    kind: str
    node: str  # the target drawn (a leader_kill targets whoever leads at the time)
    hold_s: float = 0.0  # how long a held fault lasts
    started: float = 0.0  # epoch seconds
    injected: float = 0.0  # the fault's own action ended (a cut healed, a daemon back)
    whole: float = 0.0  # the job was whole again
    note: str = ""

    def line(self) -> str:
        held = f" for {self.hold_s:.1f}s" if self.hold_s else ""
        return f"{self.kind}@{self.node}{held}"


def schedule(seed: int, count: int) -> list[Fault]:
    """`count` faults (at least one of each kind, in a seeded order)."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds += [rng.choice(KINDS) for _ in range(max(0, count - len(kinds)))]
    faults = []
    for kind in kinds:
        lo, hi = HELD.get(kind, (0.0, 0.0))
        faults.append(Fault(kind, rng.choice(NODES), round(rng.uniform(lo, hi), 1)))
    return faults


@dataclass
class Cluster:
    """etcd on its own host and one daemon per node; every life of every daemon kept."""

    root: Path
    network: Network
    steps: int
    lives: dict[str, list[Daemon]] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    etcd: Proc | None = None
    pace_s: float = PACE_S  # what every life's ranks sleep at each forward (see keep_up)

    def __post_init__(self) -> None:
        self.etcd_host = self.network.add_host("etcd")
        self.etcd = etcd_on(self.etcd_host, self.root)
        for node in NODES:
            self.hosts[node] = self.network.add_host(node)
            self.start(node)

    @property
    def endpoint(self) -> str:
        return f"{self.etcd_host.address}:2379"

    @property
    def checkpoints(self) -> Path:
        return self.root / "ckpt"

    def start(self, node: str) -> Daemon:
        life = len(self.lives.setdefault(node, []))
        settings = [
            *OVERRIDES,
            f"train.steps={self.steps}",
            f'checkpoint.dir="{self.checkpoints}"',
        ]
        d = start_daemon(
            self.root, f"node-{node}", [self.endpoint], overrides=settings,
            host=self.hosts[node], name=f"node-{node}.{life}", pace_s=self.pace_s,
        )  # fmt: skip
        self.lives[node].append(d)
        return d

    def daemon(self, node: str) -> Daemon:
        return self.lives[node][-1]

    def keep_up(self, done: int, count: int, room: int) -> float:
        """Pace the job so that it leaves the faults not yet injected their share of
        `room` steps: with `done` of `count` injected, a job past `done + 1` shares (one
        ahead) sleeps HOLD_PACE_S a step, else PACE_S. A faster machine trains more
        steps in a fault's seconds (a hang is found in ~18 s whatever the pace); left at
        PACE_S, it ran out of steps before the last faults. Returns the pace set."""
        ahead = self.step() > room * (done + 1) // count
        self.pace_s = HOLD_PACE_S if ahead else PACE_S
        for node in NODES:
            self.daemon(node).slow(self.pace_s)
        return self.pace_s

    def every_life(self) -> list[Daemon]:
        return [d for lives in self.lives.values() for d in lives]

    def leader(self) -> str:
        def find() -> str | None:
            return next((n for n in NODES if (self.daemon(n).status() or {}).get("leader")), None)

        found: str = wait_for(find, 60, "a leader")
        return found

    def steps_since(self, t: float) -> dict[str, list[dict[str, object]]]:
        return {
            n: [e for e in self.daemon(n).events("train_step") if event_time(e) > t] for n in NODES
        }

    def wait_whole(self, since: float) -> None:
        """Until every node's group committed a step with all three groups, after `since`."""

        def whole() -> bool:
            return all(
                any(e.get("participants") == len(NODES) for e in steps)
                for steps in self.steps_since(since).values()
            )

        wait_for(whole, WHOLE_TIMEOUT_S, "the job to be whole again (3 groups committing)", 0.5)
        # ... and over for every node too: etcd answers it, its loss judged, and its record
        # of the fault closed (/status), so that the next fault is a failure of its own
        # rather than part of this one (an etcd outage and a cut a node could not tell
        # apart: the job commits through the lighthouse long before a node's next etcd try).
        wait_for(self.settled, WHOLE_TIMEOUT_S, "every node to see etcd and close its incident")

    def settled(self) -> bool:
        docs = [self.daemon(n).status() for n in NODES]
        return all(
            doc is not None
            and doc["etcd_up"]
            and doc["etcd_lost"] is None
            and all(i["recovered"] is not None for i in doc["incidents"])
            for doc in docs
        )

    def step(self) -> int:
        return max(self.daemon(n).step() for n in NODES)

    def close(self) -> None:
        for d in self.every_life():
            d.stop()
        if self.etcd is not None:
            self.etcd.stop()


# ------------------------------------------------------------------ the faults


def _rank(c: Cluster, node: str) -> int:
    pids = wait_for(lambda: c.daemon(node).rank_pids(), 60, f"node-{node}'s ranks")
    return int(pids[0])


def rank_kill(c: Cluster, f: Fault) -> None:
    os.kill(_rank(c, f.node), signal.SIGKILL)


def rank_stop(c: Cluster, f: Fault) -> None:
    """SIGSTOP a rank in steady state: its daemon must find the hang and restart it."""
    d = c.daemon(f.node)
    wait_for(lambda: (d.status() or {}).get("hang", {}).get("learned"), 60, "a learned timeout")
    os.kill(_rank(c, f.node), signal.SIGSTOP)
    hung = wait_for(
        lambda: [e for e in d.events("group_failed") if event_time(e) > f.started],
        90,
        f"node-{f.node} to find its stopped rank",
    )
    assert hung[0]["kind"] == "hung", hung
    f.note = f"found after {event_time(hung[0]) - f.started:.1f}s"


def slow_rank(c: Cluster, f: Fault) -> None:
    """Stop and continue a rank 0.1 s each until `hold_s` passed: it computes at half speed."""
    pid = _rank(c, f.node)
    end = time.monotonic() + f.hold_s
    try:
        while time.monotonic() < end:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.1)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
    except ProcessLookupError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _kill_every_rank(c: Cluster) -> None:
    pids = [p for n in NODES for p in c.daemon(n).rank_pids()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _saved(c: Cluster) -> bool:
    return any(d.events("checkpoint_saved") for d in c.every_life())


def _loaded_since(c: Cluster, t: float) -> list[dict[str, object]]:
    return [e for d in c.every_life() for e in d.events("checkpoint_loaded") if event_time(e) > t]


def cold_restart(c: Cluster, f: Fault) -> None:
    """Every rank of every node SIGKILLed at once: the groups resume from a checkpoint."""
    wait_for(lambda: _saved(c), 60, "a first checkpoint")
    _kill_every_rank(c)
    loaded = wait_for(lambda: _loaded_since(c, f.started), 90, "a checkpoint to be loaded")
    f.note = f"resumed at step {loaded[0]['step']}"


def _complete(c: Cluster) -> list[Path]:
    return [p.parent for p in c.checkpoints.glob("*/run-*/step-*/COMPLETE.json")]


def corrupt_checkpoint(c: Cluster, f: Fault) -> None:
    """Flip a byte of the newest complete checkpoint, then restart every rank: none may load
    it (its checksum fails; an older one, or a newer one completed meanwhile, is used).
    Two complete ones first: with only the corrupted one, the job starts over and loads
    nothing, which is right but is not this fault."""
    wait_for(lambda: len(_complete(c)) >= 2, 90, "two complete checkpoints")
    complete = _complete(c)
    newest = max(complete, key=lambda p: int(p.name.removeprefix("step-")))
    shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    _kill_every_rank(c)
    loaded = wait_for(lambda: _loaded_since(c, f.started), 90, "a checkpoint to be loaded")
    sources = {str(e.get("source")) for e in loaded}
    assert str(newest) not in sources, f"a corrupted checkpoint was loaded: {newest}"
    f.note = f"corrupted {newest.name}; resumed at step {loaded[0]['step']}"


def _restart(c: Cluster, node: str) -> None:
    c.start(node)


def daemon_kill(c: Cluster, f: Fault) -> None:
    """SIGKILL a follower's daemon (its ranks die with it), then start it again."""
    leader = c.leader()
    if f.node == leader:
        f.node = next(n for n in NODES if n != leader)
    os.kill(c.daemon(f.node).pid, signal.SIGKILL)
    c.daemon(f.node).wait(30)
    _restart(c, f.node)


def leader_kill(c: Cluster, f: Fault) -> None:
    f.node = c.leader()
    os.kill(c.daemon(f.node).pid, signal.SIGKILL)
    c.daemon(f.node).wait(30)
    _restart(c, f.node)


def drain(c: Cluster, f: Fault) -> None:
    """SIGTERM: the node drains and exits 0; then it starts again."""
    d = c.daemon(f.node)
    os.kill(d.pid, signal.SIGTERM)
    assert d.wait(60) == 0, d.proc.tail()
    _restart(c, f.node)


def etcd_kill(c: Cluster, f: Fault) -> None:
    """SIGKILL etcd; start it again on its data after `hold_s`."""
    assert c.etcd is not None
    c.etcd.popen.kill()
    c.etcd.popen.wait(10)
    time.sleep(f.hold_s)
    c.etcd = etcd_on(c.etcd_host, c.root)


def host_isolated(c: Cluster, f: Fault) -> None:
    """The node's host cut off from everything (its link down) for `hold_s`."""
    host = c.hosts[f.node]
    c.network.isolate(host)
    try:
        time.sleep(f.hold_s)
    finally:
        c.network.rejoin(host)


def etcd_cut(c: Cluster, f: Fault) -> None:
    """The node's host cut from etcd only (its peers still reach it) for `hold_s`."""
    host = c.hosts[f.node]
    c.network.cut(host, c.etcd_host)
    try:
        time.sleep(f.hold_s)
    finally:
        c.network.heal(host, c.etcd_host)


INJECT: dict[str, Callable[[Cluster, Fault], None]] = {
    "rank_kill": rank_kill,
    "rank_stop": rank_stop,
    "slow_rank": slow_rank,
    "cold_restart": cold_restart,
    "corrupt_checkpoint": corrupt_checkpoint,
    "daemon_kill": daemon_kill,
    "leader_kill": leader_kill,
    "drain": drain,
    "etcd_kill": etcd_kill,
    "host_isolated": host_isolated,
    "etcd_cut": etcd_cut,
}
