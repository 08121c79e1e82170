"""Replica groups of real ranks launched directly, as the daemon would launch them, and
the torchft lighthouse they meet at: for tests of the trainer without daemons."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daemon.leadership.lighthouse import lighthouse_command
from tests.support.harness import Event, Proc, kill_all, start, wait_for
from tests.support.ports import free_port


@dataclass
class Lighthouse:
    proc: Proc
    address: str


def start_lighthouse(log_dir: Path, min_replicas: int = 1) -> Lighthouse:
    port = free_port()
    proc = start(
        [
            *lighthouse_command(),  # what the daemon runs
            "--min_replicas",
            str(min_replicas),
            "--bind",
            f"127.0.0.1:{port}",
            "--join_timeout_ms",
            "1000",
            "--heartbeat_timeout_ms",
            "2000",
        ],
        log_dir,
        "lighthouse",
    )
    with socket.socket() as s:
        wait_for(lambda: s.connect_ex(("127.0.0.1", port)) == 0, 20, "the lighthouse to listen")
    return Lighthouse(proc, f"http://127.0.0.1:{port}")


@dataclass
class Group:
    """The ranks of one replica group, launched directly (as the daemon does)."""

    ranks: list[Proc] = field(default_factory=list)

    @property
    def rank0(self) -> Proc:
        return self.ranks[0]

    def events(self, name: str | None = None) -> list[Event]:
        return self.rank0.events(name)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        return [r.wait(max(1.0, deadline - time.monotonic())) for r in self.ranks]

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        kill_all([r.pid for r in self.ranks], sig)

    def stop(self) -> None:
        for r in self.ranks:
            r.stop()

    def committed_steps(self) -> list[int]:
        return [int(e["step"]) for e in self.events("train_step")]


def launch_group(
    config: Path | str,
    log_dir: Path,
    group: int = 0,
    num_groups: int = 1,
    nproc: int = 1,
    lighthouse: str | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Group:
    """Start nproc ranks of `python -m trainer` with the env contract; fresh store port."""
    port = free_port()
    result = Group()
    argv = [sys.executable, "-m", "trainer", "--config", str(config)]
    for o in overrides:
        argv += ["--set", o]
    for rank in range(nproc):
        rank_env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(num_groups),
            "OMP_NUM_THREADS": "1",
            **({"TORCHFT_LIGHTHOUSE": lighthouse} if lighthouse else {}),
            **(env or {}),
        }
        label = f"{name or f'g{group}'}-r{rank}"
        result.ranks.append(start(argv, log_dir, label, rank_env))
    return result


@contextlib.contextmanager
def cleanup(*items: Proc | Group | Lighthouse) -> Iterator[None]:
    try:
        yield
    finally:
        for item in items:
            if isinstance(item, Lighthouse):
                item.proc.stop()
            else:
                item.stop()
