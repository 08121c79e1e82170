"""The daemon's side of the standby zygote (trainer/spares/zygote.py): one warm process per
node that forks standbys, so a refill costs milliseconds of CPU instead of a fresh
import of torch (about 3 CPU-seconds that a busy node's ranks pay for).

The zygote is spawned like a standby (its own session, PR_SET_PDEATHSIG) with one end
of a SOCK_SEQPACKET socket pair. :meth:`Zygote.fork` makes the standby's three pipes,
sends their far ends with its environment, and waits for the pid. While it waits
the daemon is a child subreaper (PR_SET_CHILD_SUBREAPER): the zygote forks twice and
the middle process exits, so the kernel hands the standby to the daemon, which then
waits for it, signals it and reads its exit status as it does for a spawned rank
(:class:`ForkedProcess`). The flag is cleared at once, so orphans of other processes
still go to init as before.

Anything that goes wrong (the zygote died, refused to fork, answered late) returns
None and the pool spawns the standby as before; a zygote that exits is replaced,
up to :data:`MAX_ZYGOTE_DEATHS` times before it is ready.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from daemon.children import kill_tree
from daemon.ranks.rank_process import Output, RankEvent, Watched, spawn
from daemon.ranks.spec import RANK_ARGV, GroupSpec, rank_env
from trainer.contracts import spare_messages

PR_SET_CHILD_SUBREAPER = 36
FORK_TIMEOUT_S = 5.0  # a zygote that takes longer to answer is given up
UNKNOWN_STATUS = 255  # the exit status of a standby that another process reaped
MAX_ZYGOTE_DEATHS = 3  # zygotes in a row that exit before ready: stop using one


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants for the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


class ForkedProcess:
    """A standby the zygote forked and the daemon adopted: what the daemon uses of a
    subprocess.Popen (daemon/ranks/rank_process.py:ChildProcess)."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time (the readers wait too)

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # not ours any more: its status went elsewhere
                    self.returncode = UNKNOWN_STATUS
                    return self.returncode
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"standby {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Zygote(Watched):
    """One warm process that forks this node's standbys."""

    def __init__(self, spec: GroupSpec, sink: RankEvent, wake: threading.Event | None) -> None:
        self.sink = sink
        self.metrics_dir = spec.metrics_dir
        self.ready = threading.Event()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [*RANK_ARGV, "--zygote", "--control-fd", str(theirs.fileno())]
        argv += ["--config", str(spec.config_path)]
        try:
            self.popen = spawn(argv, rank_env(spec, 0, 0, 0), pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        ours.settimeout(FORK_TIMEOUT_S)
        self.control = ours
        self.output = Output(self.popen, 0, None, self._relay, wake)

    def _relay(self, rank: int, event: dict[str, Any]) -> None:
        if event.get("event") == "standby_zygote_ready":
            self.ready.set()
        event.pop("rank", None)
        self.sink(rank, event)

    def fork(self, env: dict[str, str]) -> ForkedProcess | None:
        """A new standby with environment `env`, or None (the caller spawns one)."""
        if not self.ready.is_set() or not self.alive():
            return None
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        request = spare_messages.start(env)
        pid = 0
        try:
            with subreaper():
                socket.send_fds(self.control, [request], [stdin_r, stdout_w, stderr_w])
                pid = spare_messages.forked_pid(self.control.recv(4096))
        except (OSError, ValueError, KeyError):  # late, or gone: never asked again
            self.kill()
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        if pid and parent_of(pid) != os.getpid():  # not adopted: it exits by itself
            pid = 0
        if not pid:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            return None
        return ForkedProcess(
            pid, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), os.fdopen(stderr_r, "rb")
        )

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()
        kill_tree([self.pid])
        self.output.reap(self.metrics_dir)
