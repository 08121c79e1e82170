"""One worker process of bench/scale.py: simulated Phalanx nodes, one thread each.

A simulated node is what ``daemon/supervision/supervisor.py`` runs, minus ranks: a
:class:`DaemonConfig` read from the bench's job file, a :class:`Coordinator`, a
:class:`NodeView` and an :class:`EtcdUpkeep` built as ``Supervisor`` builds it (with a
``wake`` event's ``set``). Its loop is ``Supervisor.run``'s: each round one
``upkeep.tick()`` and the state's handler, then ``wake.wait`` for the rest of
``TICK_S``. The handlers keep what concerns etcd: JOINING calls ``join()``, CLAIMING
``claim()`` (a spare keeps calling it), WAITING waits for a lighthouse address and
starts "ranks" (``ranks_started()``, the job's state set to running), RUNNING trains
(the step moves ``STEPS_PER_S`` times a second, ``participants`` is the number of slots
held) and pauses when the lease is unconfirmed, FENCED asks ``fence_verdict()``. The
leader's lighthouse is the real one (``node.lighthouse_port = 0`` in the job file:
every leader's gate gets a free port, so a new leader never waits for a stalled one's).

Which ``daemon`` package is imported is the caller's choice (its PYTHONPATH and working
directory): the bench runs a baseline revision's copy the same way.

    python -m bench.scale_node --job JOB.toml --root DIR --first 1 --count 25

Protocol: one JSON object a line. stdin: ``{"cmd": "go" | "stats" | "stall" | "quit"}``;
stdout: ``{"ready": ...}`` once the nodes are built, then one reply per command. The
daemon's log events go to stderr. ``stall`` replies and then stops this whole process
(SIGSTOP) with its keepalives: the bench uses it on a worker that hosts only the leader.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import daemon
from daemon.config import DaemonConfig, load_daemon_config
from daemon.coordination import Coordinator, EtcdSettings
from daemon.node_state import NodeView, State
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import Join, UpkeepReport
from daemon.supervision.reports import node_status, upkeep_input
from daemon.supervision.supervisor import TICK_S
from daemon.supervision.upkeep import EtcdUpkeep
from trainer import logs

STEPS_PER_S = 5.0  # the simulated group's training steps
HTTP_PORT_BASE = 20000  # a plausible port for each node's record (nothing listens on it)


def node_id(index: int) -> str:
    return f"node-{index:05d}"


class SimNode:
    """One simulated daemon: the supervisor's loop and the etcd side of its handlers."""

    def __init__(self, cfg: DaemonConfig, index: int) -> None:
        self.cfg = cfg
        settings = EtcdSettings(endpoints=list(cfg.etcd.endpoints), timeout_s=cfg.etcd.timeout_s)
        self.coord = Coordinator(settings, cfg.job.name, cfg.node_id, cfg.etcd.lease_ttl_s)
        self.view = NodeView()
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self.wake = threading.Event()
        self.report = UpkeepReport()  # the upkeep's last
        self.progress = RankProgress()  # as its ranks would report it
        # The record is read from the node's status, as the daemon publishes it each tick.
        status = lambda: node_status(self.view, cfg, self.report, None, self.progress)  # noqa: E731
        self.upkeep = EtcdUpkeep(cfg, self.coord, cfg.run_dir, status, self.wake.set)
        self.upkeep.serving_http(HTTP_PORT_BASE + index % 40000)
        self.registered_at: float | None = None
        self.running_at: float | None = None  # when RUNNING was last entered
        self.step_base = 0
        self.ticks = 0
        self.busy_s = 0.0  # time inside rounds (the GIL's waits included)
        self.late_s = 0.0  # how much later than TICK_S the rounds that were not woken began
        self.refusal: str | None = None

    def run(self, stop: threading.Event) -> None:
        """``Supervisor.run``'s loop until `stop`; the lease is revoked at the end."""
        logs.bind(job=self.cfg.job.name, node=self.cfg.node_id)
        try:
            while not stop.is_set() and self.view.state not in (State.FAILED, State.DONE):
                started = time.monotonic()
                self.tick(started)
                ended = time.monotonic()
                self.busy_s += ended - started
                woken = self.wake.wait(max(0.0, TICK_S - (ended - started)))
                if not woken:
                    self.late_s += max(0.0, time.monotonic() - max(ended, started + TICK_S))
                self.wake.clear()
        finally:
            self.upkeep.close()

    def tick(self, now: float) -> None:
        view = self.view
        if view.state == State.RUNNING and self.running_at is not None:
            step = self.step_base + int((now - self.running_at) * STEPS_PER_S)
            job = self.report.job
            joined = len(job.groups) if job is not None else None
            self.progress = replace(self.progress, step=step, participants=joined)
        self.report = self.upkeep.tick(upkeep_input(view, self.progress))
        if self.report.slot_lost and view.state in (State.RUNNING, State.FENCED):
            self.move(State.CLAIMING if self.report.slot is None else State.WAITING)
        for _ in range(len(State)):  # a move runs the new state's handler in the same round
            before = view.state
            self.move(self.handle(before))
            self.report = self.upkeep.report()
            if view.state == before:
                break
        self.ticks += 1

    def move(self, to: State) -> None:
        if to == self.view.state:
            return
        if to == State.RUNNING:
            self.running_at, self.step_base = time.monotonic(), self.progress.step
        self.view.state = to

    def handle(self, state: State) -> State:
        view, upkeep = self.view, self.upkeep
        if state == State.JOINING:
            joined = upkeep.join()
            if joined == Join.REFUSED:
                self.refusal = upkeep.refusal
                return State.FAILED
            if joined == Join.NOT_YET:
                return State.JOINING
            view.registered, self.registered_at = True, time.monotonic()
            return State.CLAIMING
        if state == State.CLAIMING:
            return State.CLAIMING if upkeep.claim() is None else State.WAITING
        if state == State.WAITING:
            if self.report.slot is None:
                return State.CLAIMING
            if self.report.ranks_lighthouse is None:
                return State.WAITING
            upkeep.ranks_started()
            job = self.report.job
            job_state = job.state if job is not None else None
            if not job_state or job_state.get("state") not in ("running", "completed"):
                upkeep.set_state("running", self.progress.step)
            return State.RUNNING
        if state == State.RUNNING:
            return State.FENCED if self.report.must_pause else State.RUNNING
        if state == State.FENCED:
            verdict, _ = upkeep.fence_verdict(upkeep_input(view, self.progress))
            if verdict == "keep":
                return State.RUNNING
            return State.FENCED if verdict == "hold" else State.WAITING  # discard: restart
        return state


def stats(nodes: list[SimNode]) -> dict[str, Any]:
    """What the bench polls: counts and the latest times (monotonic, shared by processes)."""
    running = [n.running_at for n in nodes if n.view.state == State.RUNNING and n.running_at]
    registered = [n.registered_at for n in nodes if n.registered_at is not None]
    return {
        "n": len(nodes),
        "states": dict(Counter(n.view.state.value for n in nodes)),
        "registered": sum(n.view.registered for n in nodes),
        "last_registered": max(registered, default=None),
        "last_running": max(running, default=None),
        "slots": sum(n.report.slot is not None for n in nodes),
        "leaders": [n.cfg.node_id for n in nodes if n.report.leader],
        "ticks": sum(n.ticks for n in nodes),
        "busy_s": sum(n.busy_s for n in nodes),
        "late_s": sum(n.late_s for n in nodes),
        "refused": [n.refusal for n in nodes if n.refusal][:3],
    }


def stall(nodes: list[SimNode]) -> dict[str, Any]:
    """The moment of the stall and each node's last confirmed keepalive (send time)."""
    confirmed = [n.coord.lease_confirmation() for n in nodes]
    return {
        "stalled_at": time.monotonic(),
        "confirmed": [c[1] if c is not None else None for c in confirmed],
        "leases": [c[0] if c is not None else None for c in confirmed],
        "leaders": [n.cfg.node_id for n in nodes if n.report.leader],
    }


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(nodes: list[SimNode]) -> None:
    stop = threading.Event()
    threads = [
        threading.Thread(target=n.run, args=(stop,), name=n.cfg.node_id, daemon=True) for n in nodes
    ]
    for line in sys.stdin:
        cmd = json.loads(line).get("cmd")
        if cmd == "go":
            for t in threads:
                t.start()
            reply({"started": time.monotonic()})
        elif cmd == "stats":
            reply(stats(nodes))
        elif cmd == "stall":
            reply(stall(nodes))
            os.kill(os.getpid(), signal.SIGSTOP)
        elif cmd == "quit":
            break
    stop.set()
    deadline = time.monotonic() + 10.0
    for t in threads:
        if t.is_alive():
            t.join(max(0.0, deadline - time.monotonic()))
    reply({"bye": True})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", type=Path, required=True, help="the job file every node reads")
    p.add_argument("--root", type=Path, required=True, help="each node's run_dir goes under it")
    p.add_argument("--first", type=int, required=True, help="index of this worker's first node")
    p.add_argument("--count", type=int, required=True, help="nodes in this worker")
    args = p.parse_args(argv)
    logs.configure(json_output=True, stream=sys.stderr)
    nodes = []
    for index in range(args.first, args.first + args.count):
        name = node_id(index)
        run_dir = args.root / name
        cfg = load_daemon_config(args.job, [f'node.run_dir="{run_dir}"'], node_id=name)
        nodes.append(SimNode(cfg, index))
    reply({"ready": True, "pid": os.getpid(), "daemon": str(Path(daemon.__file__).parent)})
    serve(nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
