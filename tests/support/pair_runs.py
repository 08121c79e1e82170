"""Whole runs of daemons for the tests that stop a job and start it again: run to the
end, kill a pair once a checkpoint is on disk, start the pair again on its old slots."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.harness import Daemon, hurry, job_groups, slow, start_daemon, wait_for
from trainer.checkpoint.files import MARKER


def run_to_end(daemons: Sequence[Daemon], timeout: float = 240) -> None:
    """Wait for every daemon to exit 0 (its tail in the failure otherwise); stop them all."""
    try:
        for d in daemons:
            assert d.wait(timeout) == 0, d.proc.tail()
    finally:
        for d in daemons:
            d.stop()


def resumed_to_end(daemons: Sequence[Daemon]) -> None:
    """Once each daemon's fenced ranks are resumed (group_resumed), let them run unpaced
    to the end (run_to_end)."""
    for d in daemons:
        wait_for(functools.partial(d.events, "group_resumed"), 60, f"{d.node_id} to resume")
    hurry(*daemons)
    run_to_end(daemons)


def heal_divergence_to_end(daemons: Sequence[Daemon], minority: Daemon) -> None:
    """Wait for `minority` to find its divergence and heal after it, the others paced
    meanwhile, then run every daemon to the end. The restarted minority comes back in
    seconds; a loaded machine can take longer than the majority needs for its remaining
    steps at full pace (seen in CI: 15 s, the job over before it healed), so the
    majority waits on time, paced, until it has healed."""
    try:
        wait_for(lambda: minority.events("replicas_diverged"), 120, "the divergence found")
        slow(*(d for d in daemons if d is not minority), pace_s=0.5)
        found_at = int(minority.events("replicas_diverged")[0]["step"])
        wait_for(
            lambda: any(int(e["step"]) > found_at for e in minority.events("heal_done")),
            120,
            "the minority to heal after the divergence",
        )
        hurry(*daemons)
    except BaseException:
        for d in daemons:
            d.stop()
        raise
    run_to_end(daemons)


def run_pair_again(
    tmp_path: Path,
    endpoint: str,
    job: list[str],
    envs: dict[str, dict[str, str]] | None = None,
) -> tuple[list[Daemon], float]:
    """node-a and node-b started again once the first pair's slots are free (so each gets
    its old slot back), run to the end unpaced (a cold start's faults come at step 0); the
    daemons and when they were started (epoch s). `envs`: extra environment by node id."""
    wait_for(lambda: job_groups(endpoint) == {}, 30, "free slots")
    started_at = time.time()
    again = [
        start_daemon(
            tmp_path, n, [endpoint], overrides=job, name=f"{n}-again", env=(envs or {}).get(n)
        )
        for n in ("node-a", "node-b")
    ]
    hurry(*again)
    run_to_end(again)
    return again, started_at


def kill_pair_after_checkpoint(
    tmp_path: Path,
    endpoint: str,
    job: list[str],
    ckpt: Path,
    step: int,
    during: Callable[[list[Daemon]], None] | None = None,
) -> tuple[str, str]:
    """node-a and node-b train `job` until a marked step-<step> checkpoint is under `ckpt`
    (`during(pair)` runs first); then both daemons are SIGKILLed, and with them their
    ranks. Returns the node ids of the writer group (the lower slot) and of the other."""
    pair = [start_daemon(tmp_path, n, [endpoint], overrides=job) for n in ("node-a", "node-b")]
    try:
        if during is not None:
            during(pair)
        marker = f"*/run-*/step-{step}/{MARKER}"
        wait_for(lambda: any(ckpt.glob(marker)), 120, f"the step-{step} checkpoint")
        writer = min(pair, key=lambda d: int(d.require_status()["replica_group"])).node_id
        for d in pair:
            os.kill(d.pid, signal.SIGKILL)
    finally:
        for d in pair:
            d.stop()
    return writer, "node-b" if writer == "node-a" else "node-a"
