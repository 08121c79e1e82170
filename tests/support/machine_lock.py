"""One machine, two pytest-xdist workers: a test marked ``alone`` runs with no other.

``make test`` runs the suite in two workers (``TEST_WORKERS``, see the Makefile): in one,
its processes keep about one of the two cores busy on average (docs/benchmarks.md), so
a second worker fills the idle half. It runs the ``alone`` tests afterwards in a pytest
process of their own, so this lock is contended only where both kinds share one run
(a plain ``pytest -n 2``).
A test whose checks are timings (the random-fault test's pause bounds) must not share
the machine. Every test holds a shared lock while it runs, an ``alone`` test the
exclusive one; a turnstile lets a waiting ``alone`` test in after the running test
instead of behind every later one. Without xdist the locks are never contended.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _flocked(path: Path, how: int) -> Iterator[None]:
    with path.open("a") as f:  # a description of its own: flock is per open file
        fcntl.flock(f, how)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine(lock_dir: Path, alone: bool) -> Iterator[None]:
    """Hold the machine for one test: shared, or all of it when `alone`."""
    turnstile, main = lock_dir / "machine.turnstile", lock_dir / "machine.lock"
    if alone:
        with _flocked(turnstile, fcntl.LOCK_EX), _flocked(main, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as held:
        with _flocked(turnstile, fcntl.LOCK_EX):  # waits while an alone test waits or runs
            held.enter_context(_flocked(main, fcntl.LOCK_SH))
        yield
