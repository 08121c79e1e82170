"""`phalanx demo`: an embedded etcd, two node daemons on this machine, one failure, one heal.

The demo is an outside observer: it reads both daemons' JSON event streams, prints
progress, SIGKILLs node B's ranks (found through B's `group_started` event) a
third of the way through (or at `kill_at`; 0: never), and ends with a summary. It
exits 0 only if both daemons finish, the failure asked for was injected and healed,
and both replica groups end with the same `params_sha256`. That digest does not
depend on when the kill lands, or whether it does (docs/architecture.md, "The data
contract").
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

from daemon.children import descendants, free_port
from daemon.coordination.etcd_server import EmbeddedEtcd
from trainer.chaos import CHAOS_DELAY
from trainer.contracts import rank_events

NODES = ("node-a", "node-b")
VICTIM = "node-b"
STEP_DELAY_S = "0.1"  # PHALANX_CHAOS_DELAY: slows each step so the run can be watched
TIMEOUT_S = 240.0


@dataclass
class Node:
    name: str
    popen: subprocess.Popen[bytes]
    http_port: int
    step: int = 0
    loss: float | None = None
    pids: list[int] = field(default_factory=list)
    restarts: int = 0
    heals: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    exit_code: int | None = None


def say(text: str) -> None:
    print(text, flush=True)


def _pump(
    name: str, stream: IO[bytes], events: queue.Queue[tuple[str, dict[str, Any]]], log: Path
) -> None:
    with log.open("ab") as out:
        for raw in iter(stream.readline, b""):
            out.write(raw)
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    events.put((name, json.loads(line)))


def _start_node(
    name: str,
    job: Path,
    endpoint: str,
    workdir: Path,
    steps: int,
    events: queue.Queue[tuple[str, dict[str, Any]]],
) -> Node:
    http_port = free_port()
    overrides = {
        "etcd.endpoints": json.dumps([endpoint]),
        "node.http_port": str(http_port),
        "node.run_dir": json.dumps(str(workdir / name)),
        "node.lighthouse_port": str(free_port()),
        "train.steps": str(steps),
    }
    argv = [sys.executable, "-m", "daemon.cli", "run", "--config", str(job), "--node-id", name]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    env = {**os.environ, CHAOS_DELAY: STEP_DELAY_S, "OMP_NUM_THREADS": "1"}
    popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert popen.stderr is not None
    threading.Thread(
        target=_pump, args=(name, popen.stderr, events, workdir / f"{name}.log"), daemon=True
    ).start()
    return Node(name, popen, http_port)


def run_demo(steps: int = 240, workdir: str | None = None, kill_at: int | None = None) -> int:
    kill_at = steps // 3 if kill_at is None else kill_at
    keep = workdir is not None
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="phalanx-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    job = root / "job.toml"
    job.write_text(resources.files("daemon").joinpath("demo_job.toml").read_text())
    say(f"Phalanx demo: embedded etcd + {len(NODES)} node daemons on this machine, {steps} steps.")
    say(f"  files: {root}")
    etcd = EmbeddedEtcd(root / "etcd").start()
    say(f"  etcd listening on {etcd.endpoint}")
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    nodes = {n: _start_node(n, job, etcd.endpoint, root, steps, events) for n in NODES}
    started = time.monotonic()
    injected: dict[str, Any] | None = None
    entropy: float | None = None
    last_print = 0
    try:
        while any(n.exit_code is None for n in nodes.values()):
            if time.monotonic() - started > TIMEOUT_S:
                say(f"! the demo did not finish within {TIMEOUT_S:.0f}s; stopping.")
                break
            for n in nodes.values():
                if n.exit_code is None and n.popen.poll() is not None:
                    n.exit_code = n.popen.returncode
                    say(f"  [{n.name}] daemon exited with code {n.exit_code}")
            try:
                name, ev = events.get(timeout=0.2)
            except queue.Empty:
                continue
            node = nodes[name]
            kind = ev.get("event")
            if kind == rank_events.TRAIN_STEP:
                node.step = int(ev["step"])
                if ev.get("loss") is not None:  # None: the group healed during that step
                    node.loss = ev["loss"]
                lead = max(n.step for n in nodes.values())
                if lead >= last_print + 20:
                    last_print = lead - lead % 20
                    row = "  ".join(f"{n.name} {n.step}" for n in nodes.values())
                    say(
                        f"  step {lead:>4}/{steps}  loss {'-' if node.loss is None else f'{node.loss:.3f}'}  participants {ev.get('participants')}  ({row})"
                    )
            elif kind == rank_events.RANK_STARTED:
                entropy = ev.get("entropy", entropy)
            elif kind == "leader_elected":
                say(f"  [{name}] elected leader; it runs the torchft lighthouse")
            elif kind == "group_started":
                node.pids = list(ev.get("pids", []))
                say(f"  [{name}] replica group {ev.get('slot')} started (ranks {node.pids})")
            elif kind == "group_restarted":
                node.pids = list(ev.get("pids", []))
                node.restarts += 1
                say(
                    f"  [{name}] replica group {ev.get('slot')} restarted ({ev.get('reason')}), new ranks {node.pids}"
                )
            elif kind == "group_failed":
                say(f"  [{name}] detected: {ev.get('reason')}")
            elif kind == rank_events.HEAL_DONE:
                node.heals.append({**ev, "at": time.monotonic()})
                say(
                    f"  [{name}] healed live from its peer at step {ev.get('step')} ({ev.get('seconds')}s in the quorum)"
                )
            elif kind == rank_events.TRAIN_DONE:
                node.done = ev
                say(
                    f"  [{name}] finished: step {ev.get('step')}, params_sha256 {str(ev.get('params_sha256'))[:16]}..."
                )
            victim = nodes[VICTIM]
            if kill_at and injected is None and victim.pids and nodes[NODES[0]].step >= kill_at:
                pids = [p for pid in victim.pids for p in (*descendants(pid), pid)]
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                injected = {"pids": pids, "step": victim.step, "at": time.monotonic()}
                say(
                    f"  >>> injecting a failure: SIGKILL {VICTIM}'s ranks {pids} at step {victim.step}"
                )
    finally:
        for n in nodes.values():
            if n.popen.poll() is None:
                n.popen.send_signal(signal.SIGTERM)
        for n in nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                n.popen.wait(20)
            if n.popen.poll() is None:
                n.popen.kill()
            n.exit_code = n.popen.returncode
        etcd.stop()
    return _summary(nodes, injected, entropy, steps, root, keep, asked=bool(kill_at))


def _summary(
    nodes: dict[str, Node],
    injected: dict[str, Any] | None,
    entropy: float | None,
    steps: int,
    root: Path,
    keep: bool,
    asked: bool = True,
) -> int:
    victim = nodes[VICTIM]
    digests = {n.name: (n.done or {}).get("params_sha256") for n in nodes.values()}
    match = len(set(digests.values())) == 1 and None not in digests.values()
    heal = next((h for h in victim.heals if injected and h["at"] > injected["at"]), None)
    ok = (
        match
        and all(n.exit_code == 0 for n in nodes.values())
        and (not asked or (injected is not None and heal is not None))
    )
    final = [n.done["loss"] for n in nodes.values() if n.done and n.done.get("loss") is not None]
    say("")
    say("Phalanx demo summary")
    reached = " / ".join(f"{n.name} {(n.done or {}).get('step', n.step)}" for n in nodes.values())
    say(f"  steps              {reached} of {steps}")
    if injected:
        say(
            f"  failures injected  1 (SIGKILL of {VICTIM}'s ranks {injected['pids']} at step {injected['step']})"
        )
    elif asked:
        say("  failures injected  0 (the run ended before the injection point)")
    else:
        say("  failures injected  0 (none asked: --kill-at 0)")
    per_node = ", ".join(f"{n.name} {n.restarts}" for n in nodes.values())
    say(f"  restarts           {sum(n.restarts for n in nodes.values())} ({per_node})")
    if heal and injected:
        say(
            f"  time to heal       {heal['at'] - injected['at']:.1f}s from the kill to {VICTIM}'s heal_done at step {heal.get('step')}"
        )
    else:
        say("  time to heal       - (no heal observed)")
    loss = f"{final[0]:.4f}" if final else "-"
    say(f"  final loss         {loss}" + (f" (corpus entropy {entropy:.4f})" if entropy else ""))
    for name, digest in digests.items():
        say(f"  params_sha256      {name} {digest or '-'}")
    say(f"  digests match      {'yes' if match else 'NO'}")
    say(f"  result             {'OK' if ok else 'FAILED'}")
    if ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        say(f"  logs               {root}")
    return 0 if ok else 1
