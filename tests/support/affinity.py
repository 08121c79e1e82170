"""The CPUs a process tree may run on, narrowed and widened from outside: how a test takes
cores away from a daemon (health.devices on a CPU node counts them) and gives them back."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from daemon.children import descendants


@contextlib.contextmanager
def pinned(cpus: Sequence[int]) -> Iterator[None]:
    """This thread runs on `cpus` meanwhile, and so does every process it starts then."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def set_tree_affinity(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of `pid` and of its descendants may run on `cpus` from now on."""
    for proc in (pid, *descendants(pid)):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{proc}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cpus)
