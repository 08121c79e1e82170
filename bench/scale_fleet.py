"""The processes of one bench/scale.py run: worker processes of simulated nodes
(bench/scale_node.py) and the snapshots of etcd's counters and everyone's CPU.

Worker 0 hosts node 0 alone and starts first, so it leads: a stall of that process
(SIGSTOP) stops the leader's keepalives and rounds and nothing else. The other N-1
nodes are spread evenly over the remaining workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.scale_measures import Snapshot, parse_prometheus, proc_ticks
from daemon.children import die_with_parent
from daemon.coordination.etcd_server import EmbeddedEtcd

ROOT = Path(__file__).resolve().parent.parent
HZ = float(os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class Tree:
    """Which ``daemon`` and ``trainer`` the workers import."""

    side: str  # "baseline" or "new"
    label: str  # a revision, or "working tree"
    root: Path  # holds daemon/ and trainer/


def ticks_of(pid: int) -> int:
    try:
        return proc_ticks(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0


def rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def machine_ticks() -> tuple[int, ...]:
    with open("/proc/stat") as f:
        return tuple(int(x) for x in f.readline().split()[1:])


class Worker:
    """One bench/scale_node.py process; JSON lines on its stdin and stdout."""

    def __init__(self, tree: Tree, job: Path, root: Path, first: int, count: int) -> None:
        self.first, self.count = first, count
        self.log = root / f"worker-{first:05d}.log"
        paths = [str(tree.root)] + ([str(ROOT)] if tree.root != ROOT else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "bench.scale_node", "--job", str(job), "--root", str(root)]
        argv += ["--first", str(first), "--count", str(count)]
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=tree.root,  # sys.path[0]: the tree's daemon before any other
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.stalled = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            with contextlib.suppress(json.JSONDecodeError):
                self.replies.put(json.loads(line))
        self.replies.put(None)

    def wait(self, timeout: float) -> dict[str, Any]:
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"worker {self.first} did not answer within {timeout:g}s") from None
        if reply is None:
            raise RuntimeError(f"worker {self.first} exited; see {self.log}")
        return reply

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd}).encode() + b"\n")
        self.proc.stdin.flush()

    def ask(self, cmd: str, timeout: float = 60.0) -> dict[str, Any]:
        self.send(cmd)
        return self.wait(timeout)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.stalled = False

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.stalled:
                self.resume()
            with contextlib.suppress(OSError, RuntimeError):
                self.ask("quit", timeout=20.0)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def events(self) -> Counter[str]:
        """Warnings and errors the nodes logged, by event name."""
        out: Counter[str] = Counter()
        with contextlib.suppress(OSError), self.log.open(errors="replace") as f:
            for line in f:
                if '"level": "warning"' in line or '"level": "error"' in line:
                    with contextlib.suppress(json.JSONDecodeError):
                        out[str(json.loads(line).get("event"))] += 1
        return out


def spread(nodes: int, procs: int) -> list[tuple[int, int]]:
    """(first, count) of each worker: node 0 alone, the rest evenly over `procs`."""
    rest = nodes - 1
    procs = max(1, min(procs, rest)) if rest > 0 else 0
    out, first = [(0, 1)], 1
    for i in range(procs):
        count = rest // procs + (1 if i < rest % procs else 0)
        out.append((first, count))
        first += count
    return out


class Fleet:
    """The workers of one run, node 0's first."""

    def __init__(self, tree: Tree, job: Path, root: Path, nodes: int, procs: int) -> None:
        self.nodes = nodes
        root.mkdir(parents=True, exist_ok=True)
        self.workers: list[Worker] = []
        for first, count in spread(nodes, procs):
            self.workers.append(Worker(tree, job, root, first, count))
        self.daemon_dirs: set[str] = set()

    def ready(self, timeout: float) -> None:
        for w in self.workers:
            reply = w.wait(timeout)
            self.daemon_dirs.add(str(reply.get("daemon")))

    def stats(self) -> dict[str, Any]:
        """Every running worker's stats, summed (a stalled worker is left out)."""
        replies = [w.ask("stats") for w in self.workers if not w.stalled]
        out: dict[str, Any] = {"states": Counter(), "leaders": [], "refused": []}
        for r in replies:
            out["states"].update(r["states"])
            out["leaders"] += r["leaders"]
            out["refused"] += r["refused"]
            for key in ("n", "registered", "slots", "ticks", "busy_s", "late_s"):
                out[key] = out.get(key, 0) + r[key]
            for key in ("last_registered", "last_running"):
                times = [t for t in (out.get(key), r[key]) if t is not None]
                out[key] = max(times, default=None)
        return out

    def cpu_ticks(self) -> int:
        return sum(ticks_of(w.pid) for w in self.workers)

    def rss_bytes(self) -> int:
        return sum(rss_of(w.pid) for w in self.workers)

    def stop(self) -> None:
        for w in self.workers:
            if w.stalled:
                w.resume()
        for w in self.workers:
            with contextlib.suppress(OSError):
                w.send("quit")
        for w in self.workers:
            w.stop()

    def events(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for w in self.workers:
            out.update(w.events())
        return out


def scrape(etcd: EmbeddedEtcd) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(etcd.metrics_url + "/metrics", timeout=10) as response:
        return parse_prometheus(response.read().decode())


def snapshot(etcd: EmbeddedEtcd, fleet: Fleet, with_stats: bool = True) -> Snapshot:
    """etcd's counters, etcd's and the workers' CPU, the machine's, the nodes' rounds."""
    extra: dict[str, float] = {}
    if with_stats:
        s = fleet.stats()
        extra = {k: float(s[k]) for k in ("ticks", "busy_s", "late_s")}
    etcd_ticks = ticks_of(etcd.pid) if etcd.pid else 0
    metrics = scrape(etcd)
    return Snapshot(
        time.monotonic(), metrics, etcd_ticks, fleet.cpu_ticks(), machine_ticks(), extra
    )
