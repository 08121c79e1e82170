"""One rank process: how it is spawned and how its output reaches the daemon's log.

Both a group's ranks and the standbys (``daemon.ranks.standby``) are spawned here. Every
line a process prints becomes an event for a *sink*: JSON lines as they are, torchft's
Rust log lines as ``library_log``, anything else as ``rank_output``. A standby's sink
changes when a group takes it over, so what it prints from then on carries the
group's slot like any rank's output.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from prometheus_client.multiprocess import mark_process_dead

from daemon.children import die_with_parent
from trainer.contracts import rank_events

RankEvent = Callable[[int, dict[str, Any]], None]
# torchft's Rust side logs `2026-01-01T00:00:00.000 [INFO] [torchft::manager] - text`.
RUST_LINE = re.compile(r"^\S+ \[(?P<level>[A-Z]+)\] \[(?P<logger>[^\]]+)\] - (?P<message>.*)$")


class ChildProcess(Protocol):
    """What the daemon uses of a rank's process: a subprocess.Popen, or a standby forked
    by the zygote and adopted by the daemon (daemon/ranks/zygote.py)."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class Watched:
    """The pid and liveness of a process the daemon keeps (a standby, the zygote)."""

    popen: ChildProcess

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def spawn(
    argv: list[str], env: dict[str, str], stdin_pipe: bool = False, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start a rank (or standby) in its own session, killed by the kernel with the daemon.

    Must be called from the supervisor's thread: PR_SET_PDEATHSIG fires when the thread
    that started the child exits, not the process."""
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=pass_fds,
        preexec_fn=die_with_parent(os.getpid()),  # PR_SET_PDEATHSIG must run in the child
    )


class Output:
    """Reader threads for a process's stdout and stderr, to their end.

    `rank` and `group` are set on events that lack them; `sink` receives each event and
    may be swapped while the process runs. `closed` is set when both streams end (the
    process exited), which wakes the supervisor at once."""

    def __init__(
        self,
        popen: ChildProcess,
        rank: int,
        group: int | None,
        sink: RankEvent,
        closed: threading.Event | None = None,
    ) -> None:
        self.rank, self.group, self.sink = rank, group, sink
        self.popen, self.closed = popen, closed
        self.readers: list[threading.Thread] = []
        self._open = 2
        self._lock = threading.Lock()
        for stream, name in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
            assert stream is not None
            # A copy of the daemon's context: events made here carry job, node, group.
            t = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self._pump, stream, name),
                daemon=True,
                name=f"rank{rank}-{name}",
            )
            t.start()
            self.readers.append(t)

    def join(self, timeout: float) -> None:
        for t in self.readers:
            t.join(timeout=timeout)

    def reap(self, metrics_dir: Path | None) -> None:
        """After the process was told to end: wait for it, drop its live gauges from the
        metrics directory (its counters keep the node's totals), let the readers finish."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        if metrics_dir is not None and metrics_dir.is_dir():
            mark_process_dead(self.popen.pid, str(metrics_dir))  # type: ignore[no-untyped-call]
        self.join(timeout=0.5)

    def _pump(self, stream: IO[bytes], name: str) -> None:
        """Nothing a rank prints may stop this thread: a reader that died would leave the
        pipe to fill, and the rank to block on it."""
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line:
                continue
            try:
                self._relay(line, name)
            except Exception as e:  # a line that parses but does not fit what its event means
                fallback: dict[str, Any] = {"event": "rank_output", "stream": name, "line": line}
                fallback.update(rank=self.rank, replica_group=self.group, unreadable=repr(e))
                with contextlib.suppress(Exception):
                    self.sink(self.rank, fallback)
        stream.close()
        with self._lock:
            self._open -= 1
            done = self._open == 0
        if done and self.closed is not None:
            # The pipes close a moment before the exit status can be read.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(1.0)
            self.closed.set()

    def _relay(self, line: str, name: str) -> None:
        event = rank_events.event_of(line)
        if event is None:
            rust = RUST_LINE.match(line)
            if rust:
                event = {
                    "event": "library_log",
                    "logger": rust["logger"],
                    "level": rust["level"].lower(),
                    "message": rust["message"],
                }
            else:
                event = {"event": "rank_output", "stream": name, "line": line}
        event.setdefault("rank", self.rank)
        if self.group is not None:
            event.setdefault("replica_group", self.group)
        self.sink(self.rank, event)
