"""A standby rank (``python -m trainer --standby``): warm up, then wait for a start.

The daemon keeps one per local rank (``daemon/ranks/standby.py``). Warming up does what
every rank start does before it needs to know which start it is: import torch,
torch.distributed and its checkpointing, torchft, the trainer, and the workload's
module; build the built-in workload (its data) from the job file. Then the process
says ``standby_ready`` and blocks reading one JSON line from stdin, ``{"env": {...}}``:
the environment of the start it joins (store port, replica group, lighthouse). It
replaces its environment with that one and runs as a rank started cold would. End
of input (the daemon closed the pipe or died) exits quietly with 0.

Nothing here may fail the standby: a problem with the job file or the workload is
found again, and reported as usual, when the rank runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer import logs
from trainer.config import TrainerConfig, load_trainer_config
from trainer.config import env as rank_vars
from trainer.contracts import rank_events as events
from trainer.contracts import spare_messages
from trainer.spares.device_warmup import warm_device
from trainer.spares.scheduling import (
    IDLE_AUTOGROUP_NICE,
    Lowered,
    autogroup_nice,
    lower_to_idle,
    set_policy,
)

# What every rank imports before it trains (torch alone is about 1.3 s here).
WARM_MODULES = (
    "torch",
    "torch.distributed.checkpoint",
    "torchft.manager",
    "torchft.process_group",
    "trainer.run",
    "trainer.ft.transport",
)


# What a standby builds before its start: the job file and the built-in workload.
Prepared = tuple[TrainerConfig, Any] | None


def warm(config_path: str, world_size: int) -> Prepared:
    """Import what a rank needs and build what depends only on the job file; return the
    job file and the built-in workload built from it when there is one (None otherwise,
    or when anything failed)."""
    for module in WARM_MODULES:
        importlib.import_module(module)
    _first_use()

    cfg: TrainerConfig | None = None
    with contextlib.suppress(Exception):
        cfg = load_trainer_config(config_path, [], world_size)
    if cfg is None:
        return None
    if cfg.parallel.pp > 1:
        with contextlib.suppress(Exception):
            importlib.import_module("trainer.parallel.pipeline")  # about 0.5 s
    if cfg.workload.spec is not None:  # a user's module: imported, not called (it may read env)
        from trainer.workloads import add_python_path

        with contextlib.suppress(Exception):
            add_python_path(cfg)
            importlib.import_module(cfg.workload.spec.partition(":")[0])
        return None
    from trainer.workloads import load  # the built-in's entry point reads only its options

    try:
        return cfg, load(cfg)
    except Exception:
        return None


def _first_use() -> None:
    """Run once what torch loads lazily on first use: the reference kernels behind a
    meta-device init (about 0.4 s), autograd and the fused optimizer step."""
    import torch

    with torch.device("meta"):
        torch.nn.Linear(4, 4)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, 4)).sum().backward()
    optimizer.step()


def _start_waiting() -> bool:
    """Whether the start's line (or end of input) is already there to read."""
    try:
        return bool(select.select([sys.stdin], [], [], 0)[0])
    except (OSError, ValueError):
        return False


class _Assignment:
    """Reads the start's line on a thread, so a start that comes while the standby still
    warms up (at idle priority) lifts it to normal priority. The daemon lifts it from
    outside too (trainer/spares/scheduling.py:leave_idle): this thread needs the interpreter
    lock, which the warm-up may hold for long at idle priority.

    `restored` says whether the session group's nice value could be put back."""

    def __init__(self, lowered: Lowered) -> None:
        self.lowered = lowered
        self.restored = True
        self.line = ""
        self.thread = threading.Thread(target=self._read, daemon=True, name="standby-stdin")
        self.thread.start()

    def _read(self) -> None:
        self.line = sys.stdin.readline()
        self.restored = self.lowered.restore()

    def wait(self) -> str:
        self.thread.join()
        return self.line


def wait_for_start(
    config_path: str, prepare: Callable[[str, int], Prepared] = warm
) -> tuple[bool, Prepared]:
    """Warm up, report ready, read the start's environment into os.environ. Returns
    (False, None) at end of input, else (True, what :func:`warm` prepared). A standby
    forked from a warm process (trainer/spares/zygote.py) passes what that one prepared.

    Warming up runs at SCHED_IDLE, in a session group lowered to nice 19, where the
    process may leave SCHED_IDLE again (as root, or with CAP_SYS_NICE): a standby
    refilled next to a training group then uses only CPU time the ranks leave idle
    (trainer/spares/scheduling.py says why both). Elsewhere it runs at normal priority."""
    started = time.monotonic()
    logs.configure()
    log = logs.get()
    lowered = lower_to_idle()
    if lowered.idle and _start_waiting():  # handed (and lifted) before it lowered itself
        lowered.restore()
        lowered = Lowered()
    assignment = _Assignment(lowered)
    prepared = None
    world = int(os.environ.get(rank_vars.WORLD_SIZE, "1"))
    try:
        prepared = prepare(config_path, world)
    except Exception as e:  # the rank will meet it again and report it properly
        log.warning("standby_warmup_failed", error=f"{type(e).__name__}: {e}")
    device_began = time.monotonic()
    device = warm_device(config_path, prepared[0] if prepared else None, world)
    seconds = round(time.monotonic() - started, 3)
    log.info(
        events.STANDBY_READY,
        pid=os.getpid(),
        seconds=seconds,
        device=device,  # "cuda:N" warmed (trainer/spares/device_warmup.py), else None
        device_seconds=round(time.monotonic() - device_began, 3),
        idle_priority=lowered.idle,
        forked=prepare is not warm,
        group_nice=IDLE_AUTOGROUP_NICE if lowered.group_nice is not None else autogroup_nice(),
    )
    line = assignment.wait()
    if lowered.idle:  # threads the warm-up started after the start's line lifted the others
        set_policy(os.SCHED_OTHER)
    if not assignment.restored:
        log.warning(
            "standby_priority_kept",
            reason=f"the kernel refused to put the session group's nice value back to "
            f"{lowered.group_nice}; this rank shares the CPU at nice {IDLE_AUTOGROUP_NICE}",
        )
    if not line:
        return False, None
    env = spare_messages.started_env(line)
    os.environ.clear()
    os.environ.update(env)
    return True, prepared
