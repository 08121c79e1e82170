"""Whether a host, or a listener on it, answers a TCP connection: a probe that needs
nothing of the process behind the port.

A live host's kernel answers a connection at once, accepted or refused, however loaded
the machine; a host that lost power or its network answers nothing. A probe connects and
closes without a word (the leader's gate does not count that as a refusal).
:class:`HostProbe` does it every :data:`PROBE_EVERY_S` from a thread of its own, so the
daemon's loop never waits on a silent host. Used by the leader's watchers
(``daemon.leadership.unreachable``) and by a spanning group asking after a member
(``daemon.supervision.seat_probe``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

PROBE_EVERY_S = 0.25
CONNECT_S = 0.25  # a live kernel answers a connection in well under a millisecond
FAILURES = 2  # probes in a row without an answer before the target counts as silent


def host_answers(host: str, port: int, timeout_s: float = CONNECT_S) -> bool:
    """Whether the kernel at (host, port) answers a connection: accepted or refused. No
    answer within `timeout_s`, or a network that cannot route there, is silence."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def listener_answers(host: str, port: int, timeout_s: float = CONNECT_S) -> bool:
    """Whether something listens at (host, port): a refusal (the host is up, nothing
    listens there) is no answer, like silence."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class HostProbe:
    """A thread that connects to one address every :data:`PROBE_EVERY_S` and counts the
    probes in a row that got no answer; `wake` is called when that count reaches
    :data:`FAILURES`, so the daemon's loop acts on it at once."""

    def __init__(
        self,
        wake: Callable[[], None],
        answers: Callable[[str, int], bool] = host_answers,
    ) -> None:
        self._wake, self._answers = wake, answers
        self._lock = threading.Lock()
        self._target: tuple[str, int] | None = None
        self._failures = 0
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, target: tuple[str, int] | None) -> None:
        """Probe `target` (host, port) from now on; None stops probing."""
        with self._lock:
            if target == self._target:
                return
            self._target, self._failures = target, 0
        if target is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="leader-probe", daemon=True)
            self._thread.start()
        self._changed.set()

    @property
    def silent(self) -> bool:
        with self._lock:
            return self._target is not None and self._failures >= FAILURES

    def close(self) -> None:
        self._stop.set()
        self._changed.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                target = self._target
            if target is None:
                self._changed.wait()
                self._changed.clear()
                continue
            started = time.monotonic()
            answered = self._answers(*target)
            with self._lock:
                if target != self._target:
                    continue  # the address moved while we probed the old one
                self._failures = 0 if answered else self._failures + 1
                reached = self._failures == FAILURES
            if reached:
                self._wake()
            self._stop.wait(max(0.0, PROBE_EVERY_S - (time.monotonic() - started)))
