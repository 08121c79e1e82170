"""The daemon's child processes: free ports, lives tied to the daemon's, /proc walking.

Every child the daemon starts (ranks, the lighthouse, an embedded etcd) is started
with :func:`die_with_parent` as its ``preexec_fn``: the kernel SIGKILLs it when the
thread that started it exits (PR_SET_PDEATHSIG), and the child checks after that
request that the daemon had not already gone. No Phalanx child outlives its daemon,
however the daemon ends. Stopping never relies on process groups: :func:`kill_tree`
signals every descendant found in /proc. A chatty child's output goes through
:func:`capped_log`, which keeps it to a bounded size on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def die_with_parent(parent: int | None = None) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the thread that started it exits."""
    parent = os.getpid() if parent is None else parent

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os._exit(1)

    return preexec


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc (process groups are not trusted)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pids: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal each pid and every descendant of it."""
    for pid in [p for root in pids for p in (*descendants(root), root)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def capped_log(stream: IO[bytes], path: Path, max_bytes: int) -> threading.Thread:
    """Copy a child's output to `path` until it closes, in a thread: when the file would
    pass `max_bytes` it becomes ``<path>.1`` (replacing the one before), so the child's
    log never takes more than twice that on disk, however long it runs (the standard
    library's RotatingFileHandler, one backup)."""

    def pump() -> None:
        out = RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=1, encoding="utf-8", errors="replace"
        )
        out.terminator = ""  # each line keeps its own newline
        # The volume is gone or full: say nothing, and go on reading, so the child never
        # blocks on a full pipe.
        out.handleError = lambda record: None  # type: ignore[method-assign]
        try:
            for line in iter(stream.readline, b""):
                out.emit(logging.makeLogRecord({"msg": line.decode("utf-8", "replace")}))
        finally:
            out.close()
            with contextlib.suppress(OSError, ValueError):
                for _ in iter(lambda: stream.read(65536), b""):
                    pass  # drain whatever is left, so the child never blocks on its pipe
            stream.close()

    thread = threading.Thread(target=pump, daemon=True, name=f"log:{path.name}")
    thread.start()
    return thread
