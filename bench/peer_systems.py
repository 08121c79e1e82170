"""The three systems bench/peers.py runs: start, read progress, kill a rank, stop.

* :class:`Torchrun`: ``torchrun --nproc_per_node 2`` of bench/peer_ddp.py, which
  restarts the whole world from the newest DCP save when a worker dies.
* :class:`BareTorchft`: a ``torchft_lighthouse`` and two one-process replica groups
  of bench/peer_torchft.py; a dead group is relaunched as soon as it is seen dead.
* :class:`Phalanx`: an embedded etcd and two ``phalanx run`` daemons, one rank each.

Ranks are found by walking the process tree from the launcher's or daemon's pid
(daemon.children.descendants), never by name. Every child is started in its own
session (a terminal's Ctrl-C reaches only the benchmark) and dies with the
benchmark's main thread (PR_SET_PDEATHSIG); :meth:`System.stop` kills every tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.peer_measures import Commit, Kill, iso_time
from bench.peer_procs import (
    BIN,
    Event,
    Tail,
    alive,
    child_env,
    env_of,
    sigkill,
    spawn,
    wait_listening,
)
from bench.peer_settings import GROUPS, phalanx_job, rows
from daemon.children import descendants, free_port, kill_tree
from daemon.config import LighthouseConfig
from daemon.coordination.etcd_server import EmbeddedEtcd
from daemon.leadership.lighthouse import lighthouse_argv, lighthouse_binary


def daemon_argv(
    job: Path, node: str, etcd: str, run_dir: Path, extra: Sequence[str] = ()
) -> list[str]:
    """`phalanx run` of `job` as `node`: its own ports and run directory, the given etcd,
    and any further KEY=VALUE settings."""
    settings = {
        "etcd.endpoints": json.dumps([etcd]),
        "node.http_port": str(free_port()),
        "node.lighthouse_port": str(free_port()),
        "node.run_dir": json.dumps(str(run_dir)),
    }
    argv = [sys.executable, "-m", "daemon.cli", "run", "--config", str(job), "--node-id", node]
    for setting in [*(f"{k}={v}" for k, v in settings.items()), *extra]:
        argv += ["--set", setting]
    return argv


# Events that end a standby's (or the standby zygote's) warm-up.
WARMED = ("standby_ready", "standby_exited", "standby_zygote_ready", "standby_zygote_exited")


class System:
    """What the benchmark needs of each system."""

    name = ""
    groups: tuple[int, ...] = tuple(range(GROUPS))

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tail = Tail()
        self.timelines: dict[int, list[Commit]] = {g: [] for g in self.groups}
        self.milestones: dict[int, list[tuple[float, str]]] = {g: [] for g in self.groups}
        self.notes: list[str] = []
        self.t0 = 0.0  # when every group had committed

    def start(self) -> None:
        raise NotImplementedError

    def quiet(self) -> bool:
        """Nothing of the system is still warming up (for a failure-free window)."""
        return True

    def poll(self) -> None:
        """Read new progress; relaunch what this system relaunches."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def victim(self, index: int) -> tuple[int, str, list[int]]:
        """The kill number `index`'s timeline group, its description and its live pids."""
        raise NotImplementedError

    def ready(self) -> bool:
        return all(self.timelines[g] for g in self.groups)

    def kill(self, index: int) -> Kill | None:
        """SIGKILL the rank(s) of kill number `index` (and their descendants)."""
        group, label, pids = self.victim(index)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return None
        every = [p for pid in pids for p in (*descendants(pid), pid)]
        t = time.time()
        sigkill(every)
        return Kill(t, group, tuple(every), label)


class Torchrun(System):
    name = "torchrun"
    groups = (0,)  # the DDP world

    def __init__(self, workdir: Path, save_every: int) -> None:
        super().__init__(workdir)
        self.save_every = save_every
        self.agent: subprocess.Popen[bytes] | None = None
        self.born: dict[str, float] = {}  # log file -> its process's start

    def start(self) -> None:
        port = free_port()
        runner = BIN / "torchrun"
        launcher = (
            [str(runner)] if runner.exists() else [sys.executable, "-m", "torch.distributed.run"]
        )
        argv = [
            *launcher,
            "--nproc_per_node", str(GROUPS),
            "--max-restarts", "100",
            "--monitor-interval", "0.1",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"bench-{port}",
            "-m", "bench.peer_ddp",
            "--log-dir", str(self.workdir / "steps"),
            "--ckpt-dir", str(self.workdir / "ckpt"),
            "--save-every", str(self.save_every),
        ]  # fmt: skip
        # torchrun 2.13 shares the agent's TCPStore with the workers across restarts, and a
        # restarted world then meets the failed attempt's keys (gloo connects to a dead
        # rank's address and the attempt fails once more); a store per round avoids it.
        env = child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        self.agent = spawn(argv, self.workdir / "torchrun.log", env)

    def poll(self) -> None:
        for path in sorted((self.workdir / "steps").glob("ddp-r*.jsonl")):
            for e in self.tail.events(path):
                kind = e.get("event")
                if kind == "start":
                    self.born[path.name] = float(e["t"])
                    self.milestones[0].append((float(e["t"]), "worker started"))
                elif kind == "resumed":
                    self.milestones[0].append((float(e["t"]), "checkpoint loaded"))
                elif kind == "commit" and e.get("rank") == 0:
                    born = self.born.get(path.name, 0.0)
                    self.timelines[0].append(Commit(float(e["t"]), int(e["step"]), born))
        if self.agent is not None and self.agent.poll() is not None:
            raise RuntimeError(f"torchrun exited with {self.agent.returncode}; see {self.workdir}")

    def victim(self, index: int) -> tuple[int, str, list[int]]:
        """Local rank index % 2: a worker, a child of the torchrun agent (never the agent)."""
        rank = index % GROUPS
        workers = descendants(self.agent.pid) if self.agent else []
        pids = [p for p in workers if env_of(p, "LOCAL_RANK") == str(rank)]
        return 0, f"rank {rank}", pids

    def stop(self) -> None:
        if self.agent is not None:
            kill_tree([self.agent.pid])
            self.agent.wait()


class BareTorchft(System):
    name = "torchft"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.born: dict[int, float] = {}  # pid -> launch time
        self.launches = 0
        self.stopping = False

    def start(self) -> None:
        port = free_port()  # Phalanx's defaults, on this host only
        argv = lighthouse_argv([lighthouse_binary()], LighthouseConfig(), f"127.0.0.1:{port}", 1)
        self.lighthouse = spawn(argv, self.workdir / "lighthouse.log", child_env())
        wait_listening(port, 30)
        self.address = f"http://127.0.0.1:{port}"
        for g in self.groups:
            self.launch(g)

    def launch(self, group: int) -> None:
        env = child_env(
            REPLICA_GROUP_ID=str(group),
            NUM_REPLICA_GROUPS=str(GROUPS),
            TORCHFT_LIGHTHOUSE=self.address,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),  # a fresh store for every launch
            RUST_LOG="warn",  # as Phalanx's ranks: torchft logs every quorum at info
        )
        argv = [
            sys.executable,
            "-m",
            "bench.peer_torchft",
            "--log-dir",
            str(self.workdir / "steps"),
        ]
        self.launches += 1
        t = time.time()
        proc = spawn(argv, self.workdir / f"g{group}-launch{self.launches}.log", env)
        self.procs[group] = proc
        self.born[proc.pid] = t
        self.milestones[group].append((t, "relaunched"))

    def poll(self) -> None:
        for g, proc in list(self.procs.items()):
            if not self.stopping and proc.poll() is not None:
                self.launch(g)  # what a user without a daemon gets, at best
        for path in sorted((self.workdir / "steps").glob("torchft-g*.jsonl")):
            pid = int(path.stem.rsplit("-", 1)[1])
            for e in self.tail.events(path):
                g, t, kind = int(e["group"]), float(e["t"]), e.get("event")
                if kind == "commit":
                    self.timelines[g].append(Commit(t, int(e["step"]), self.born.get(pid, 0.0)))
                elif kind == "start":
                    self.milestones[g].append((t, "imports done"))
                elif kind == "ready":
                    self.milestones[g].append((t, "manager ready"))
                elif kind == "healed":
                    self.milestones[g].append((t, "healed"))

    def victim(self, index: int) -> tuple[int, str, list[int]]:
        group = index % GROUPS
        proc = self.procs.get(group)
        return group, f"group {group}", [proc.pid] if proc else []

    def stop(self) -> None:
        self.stopping = True
        kill_tree([p.pid for p in self.procs.values()])
        if self.lighthouse is not None:
            kill_tree([self.lighthouse.pid])
        for p in [*self.procs.values(), *([self.lighthouse] if self.lighthouse else [])]:
            p.wait()


PHALANX_MARKS = {
    "group_failed": "group_failed",
    "group_restarted": "group_restarted",
    "rank_started": "rank_started",
    "heal_done": "heal_done",
}


class Phalanx(System):
    name = "phalanx"
    NODES = ("node-a", "node-b")

    def __init__(self, workdir: Path, max_restarts: int | None, standby: bool = True) -> None:
        super().__init__(workdir)
        self.max_restarts = max_restarts
        self.standby = standby
        if not standby:
            self.name = "phalanx-cold"
        self.etcd: EmbeddedEtcd | None = None
        self.daemons: dict[int, subprocess.Popen[bytes]] = {}
        self.pids: dict[int, list[int]] = {}  # the group's ranks, as its daemon reported them
        self.born: dict[int, float] = {}  # the group's latest start
        self.counts: dict[str, int] = {}  # soak: events that say a healthy group was evicted
        self.count_after = float("inf")
        self.warming: set[int] = set()  # standbys spawned and not yet ready, used or gone
        # A forked standby's standby_ready can be relayed before its daemon logs
        # standby_spawned: a pid already warm is not counted as warming again.
        self.warmed: set[int] = set()
        # Groups that spawned standbys, and those that started a zygote (or gave up on
        # standbys): a node starts its zygote once its first standbys are ready.
        self.with_standbys: set[int] = set()
        self.zygote_started: set[int] = set()

    def log(self, group: int) -> Path:
        return self.workdir / f"{self.NODES[group]}.log"

    def start(self) -> None:
        job = self.workdir / "job.toml"
        job.parent.mkdir(parents=True, exist_ok=True)
        job.write_text(phalanx_job())
        self.etcd = EmbeddedEtcd(self.workdir / "etcd").start()
        extra = [] if self.standby else ["node.standby=false"]
        if self.max_restarts is not None:
            extra.append(f"node.max_restarts={self.max_restarts}")
        for g, node in enumerate(self.NODES):
            argv = daemon_argv(job, node, self.etcd.endpoint, self.workdir / node, extra)
            self.daemons[g] = spawn(argv, self.log(g), child_env())

    def poll(self) -> None:
        for g, daemon in self.daemons.items():
            for e in self.tail.events(self.log(g)):
                self.event(g, e)
            if daemon.poll() is not None:
                raise RuntimeError(
                    f"{self.NODES[g]}'s daemon exited with {daemon.returncode}; see {self.log(g)}"
                )

    def event(self, group: int, e: Event) -> None:
        kind = str(e.get("event"))
        if "time" not in e:
            return
        t = iso_time(str(e["time"]))
        if kind in ("group_started", "group_restarted"):
            self.pids[group] = [int(p) for p in e.get("pids", [])]
            self.born[group] = t
            self.warming -= set(self.pids[group])  # standbys that became ranks
        if kind == "standby_spawned":
            self.with_standbys.add(group)
        if kind in ("standby_zygote_spawned", "standby_disabled"):
            self.zygote_started.add(group)
        if kind in ("standby_spawned", "standby_zygote_spawned"):
            if int(e["pid"]) not in self.warmed:
                self.warming.add(int(e["pid"]))
        elif kind in WARMED:
            self.warming.discard(int(e.get("pid", 0)))
            self.warmed.add(int(e.get("pid", 0)))
        if kind == "train_step":
            first, stop = e.get("items", [0, rows()])
            commit = Commit(t, int(e["step"]), self.born.get(group, 0.0), (stop - first) / rows())
            self.timelines[group].append(commit)
            if t > self.count_after and int(e.get("participants", 0)) < len(self.groups):
                self.count("train_step with participants < 2")
        elif kind in PHALANX_MARKS:
            self.milestones[group].append((t, PHALANX_MARKS[kind]))
        elif kind == "state_changed":
            self.milestones[group].append((t, f"state {e.get('to')}"))
        if t > self.count_after and kind in ("step_skipped", "group_failed", "group_restarted"):
            self.count(kind)

    def quiet(self) -> bool:
        """Every standby (and standby zygote) this system spawned is ready (or used, or
        gone), and every node with standbys has started its zygote: one warms at idle
        priority but still takes some CPU from busy ranks."""
        return not self.warming and self.with_standbys <= self.zygote_started

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def victim(self, index: int) -> tuple[int, str, list[int]]:
        """Node index % 2's ranks: the pids its daemon reported, if they are its descendants."""
        group = index % GROUPS
        daemon = self.daemons.get(group)
        tree = set(descendants(daemon.pid)) if daemon else set()
        return group, self.NODES[group], [p for p in self.pids.get(group, []) if p in tree]

    def quorum_changes(self) -> int | None:
        """Quorum changes the lighthouse(s) logged so far (torchft logs one line per new
        quorum id; None when no lighthouse log exists)."""
        logs = [self.workdir / n / "lighthouse.log" for n in self.NODES]
        found = [p for p in logs if p.exists()]
        if not found:
            return None
        return sum(p.read_text(errors="replace").count("Detected quorum change") for p in found)

    def stop(self) -> None:
        kill_tree([d.pid for d in self.daemons.values()])
        for d in self.daemons.values():
            d.wait()
        if self.etcd is not None:
            self.etcd.stop()
