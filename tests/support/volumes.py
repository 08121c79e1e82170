"""A small tmpfs for tests of full and read-only volumes (root ignores file modes, so a
chmod would not do): mounted for the test, remounted read-only or writable on demand,
filled to a few bytes, unmounted after."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextmanager
def tmpfs(path: Path, size: str = "256m") -> Iterator[Callable[[bool], None]]:
    """A tmpfs at `path`; the yielded function makes it writable (True) or read-only.
    Skips the test where this user cannot mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    path.mkdir()
    made = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")

    def writable(yes: bool) -> None:
        done = _mount("-o", f"remount,{'rw' if yes else 'ro'}", str(path))
        assert done.returncode == 0, done.stderr

    try:
        yield writable
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(volume: Path, leave: int, name: str = "filler") -> Path:
    """Take all but `leave` bytes of the volume with one file (returned)."""
    st = os.statvfs(volume)
    path = volume / name
    with path.open("wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, st.f_bavail * st.f_frsize - leave))
    return path
