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

import codecs
import contextlib
import ctypes
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
LOG_CHUNK_BYTES = 65536  # capped_log's largest read
LOG_SETTLE_S = 1.0  # capped_log's pause after a read that found the pipe nearly empty


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


def capped_log(
    stream: IO[bytes], path: Path, max_bytes: int, settle_s: float = LOG_SETTLE_S
) -> threading.Thread:
    """Copy a child's output to `path` until it closes, in a thread: when the file would
    pass `max_bytes` it becomes ``<path>.1`` (replacing the one before), so the child's
    log never takes more than twice that on disk, however long it runs (the standard
    library's RotatingFileHandler, one backup).

    The output is copied in whole lines, as much as the pipe holds at a time, and after
    a read that found little the thread lets `settle_s` pass before the next: a child
    that writes a line per event (the lighthouse, several per quorum) otherwise woke
    this thread, and wrote a record, for every line, taking CPU from the ranks beside it
    (issue 52). A full read goes on at once, so the child never waits on the pipe."""
    chunk = max(1, min(LOG_CHUNK_BYTES, max_bytes // 4))  # a record never fills a file

    def pump() -> None:
        out = RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=1, encoding="utf-8", errors="replace"
        )
        out.terminator = ""  # each line keeps its own newline
        # The volume is gone or full: say nothing, and go on reading, so the child never
        # blocks on a full pipe.
        out.handleError = lambda record: None  # type: ignore[method-assign]
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        read = getattr(stream, "read1", stream.read)  # what the pipe holds, up to `chunk`

        def emit(data: bytes, final: bool = False) -> None:
            text = decode(data, final)
            if text:
                out.emit(logging.makeLogRecord({"msg": text}))

        partial = b""
        try:
            while got := read(chunk):
                data, partial = partial + got, b""
                cut = data.rfind(b"\n") + 1
                if 0 < cut < len(data) and len(data) - cut < chunk:
                    data, partial = data[:cut], data[cut:]  # a line's start waits for its end
                emit(data)
                if len(got) < chunk // 2:
                    time.sleep(settle_s)  # let lines gather in the pipe
            emit(partial, final=True)
        finally:
            out.close()
            with contextlib.suppress(OSError, ValueError):
                for _ in iter(lambda: stream.read(65536), b""):
                    pass  # drain whatever is left, so the child never blocks on its pipe
            stream.close()

    thread = threading.Thread(target=pump, daemon=True, name=f"log:{path.name}")
    thread.start()
    return thread
