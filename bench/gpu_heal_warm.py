"""The warm half of bench/gpu_heal.py: two `phalanx run` daemons on one device (the demo's
job file, a real etcd), node-b's rank SIGKILLed once its standby is ready; the standby
takes the rank's place and heals from node-a."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.etcd_control import ControlledEtcd
from tests.support.harness import (
    ROOT,
    Daemon,
    event_time,
    hurry,
    largest_step_gap,
    ready_standby,
    start_daemon,
    wait_for,
)

JOB = ROOT / "daemon" / "demo_job.toml"
STEPS = 400
TOGETHER = 10  # steps both groups commit together before the kill


def together(d: Daemon) -> int:
    return sum(1 for e in d.events("train_step") if e.get("participants") == 2)


def after(d: Daemon, name: str, t: float) -> list[dict[str, Any]]:
    return [e for e in d.events(name) if event_time(e) > t]


def measure_warm(device: str) -> tuple[str, bool, dict[str, Any]]:
    """One line for the table, whether the heal happened with equal digests, the figures."""
    with tempfile.TemporaryDirectory(prefix="phalanx-gpu-heal-warm-") as scratch:
        tmp = Path(scratch)
        etcd = ControlledEtcd(tmp / "etcd")
        etcd.start()
        sets = [f'node.device="{device}"', f"train.steps={STEPS}"]
        daemons: list[Daemon] = []
        try:
            a, b = (
                start_daemon(tmp, n, [etcd.endpoint], config=JOB, overrides=sets)
                for n in ("node-a", "node-b")
            )
            daemons = [a, b]
            wait_for(lambda: min(together(a), together(b)) >= TOGETHER, 300, "both to train")
            standby = ready_standby(b, 300)
            (rank,) = b.rank_pids()
            killed = time.time()
            os.kill(rank, signal.SIGKILL)
            wait_for(lambda: after(b, "train_step", killed), 300, "node-b to commit again")
            hurry(a, b)
            codes = [a.wait(600), b.wait(600)]
        finally:
            for d in daemons:
                d.stop()
            etcd.stop()
        # Read before the scratch directory, which holds the logs, goes.
        first = min(event_time(e) for e in after(b, "train_step", killed))
        heals = after(b, "heal_done", killed)
        pause = largest_step_gap(a.events(), killed)
        ready = [e for e in b.events("standby_ready") if e.get("pid") == standby]
        started = [e for e in after(b, "rank_started", killed) if e.get("pid") == standby]
        digests = {
            d.events("train_done")[0]["params_sha256"] for d in daemons if d.events("train_done")
        }
    figures: dict[str, Any] = {
        "kill_to_commit_s": round(first - killed, 3),
        "kill_to_heal_s": round(event_time(heals[0]) - killed, 3) if heals else None,
        "survivor_longest_pause_s": round(pause, 3),
        "standby_device": ready[0].get("device") if ready else None,
        "standby_device_seconds": ready[0].get("device_seconds") if ready else None,
        "rank_from_standby": bool(started),
        "exit_codes": codes,
    }
    ok = len(digests) == 1 and codes == [0, 0] and bool(started)
    line = (
        f"the standby (device warmed: {figures['standby_device']}) took the killed rank's "
        f"place: {'it' if started else 'NOT it, a cold start,'} committed "
        f"{figures['kill_to_commit_s']:.2f} s after the kill (healed "
        f"{figures['kill_to_heal_s']} s); survivor's longest pause {pause:.2f} s; digests "
        f"{'equal' if ok else 'DIFFER or a node failed: exit codes ' + str(codes)}"
    )
    return line, ok, figures
