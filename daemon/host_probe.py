"""Whether a host, or a listener on it, answers a TCP connection: a probe that needs
nothing of the process behind the port.

A live host's kernel answers a connection at once, accepted or refused, however loaded
the machine; a host that lost power or its network answers nothing. A probe connects and
closes without a word (the leader's gate does not count that as a refusal).
:class:`HostProbe` starts one every :data:`PROBE_EVERY_S` from a thread of its own, each
probe on a small pool's thread, so the daemon's loop never waits on a silent host and a
silent probe does not hold back the next: two silences in a row are known
:data:`PROBE_EVERY_S` + :data:`CONNECT_S` after the first unanswered probe went out,
where one probe after the other took twice :data:`CONNECT_S`. Used by the leader's watchers
(``daemon.leadership.unreachable``: a silent host, not a refusing one, is suspect) and
by a spanning group's nodes watching their partners (``daemon.supervision.seats``,
``seat_probe``: a refusal is a dead daemon; silence may be a split, and is asked about).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum

PROBE_EVERY_S = 0.1  # a probe starts this often, whether the last one was answered or not
# A live kernel answers a connection in well under a millisecond, loaded or not (its
# SYN-ACK comes from the network stack, not from the process behind the port); a lost SYN
# is resent only after a second, so a longer wait would not save a probe whose SYN was
# dropped. Two in a row must go unanswered before it counts.
CONNECT_S = 0.15
FAILURES = 2  # the same answer this many probes in a row before it counts
# Probes out at once, at most: each is given CONNECT_S, so two are out while a host is
# silent; a third covers a slow resolver. A pool's thread costs about a third of a new
# one's start per probe (0.1 ms against 0.35 ms of CPU here).
IN_FLIGHT = 3


class Answer(StrEnum):
    ACCEPTED = "accepted"  # something listens there
    REFUSED = "refused"  # the host is up and nothing listens on that port
    SILENT = "silent"  # no answer in time, or no route: no power, no network, or a cut


def connect(host: str, port: int, timeout_s: float = CONNECT_S) -> Answer:
    """How the kernel at (host, port) answers one connection, closed at once. An address
    is dialled as it is (a name is resolved first): a probe runs four times a second,
    and the resolver's call was about a quarter of its CPU."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = None
    try:
        if family is None:
            with socket.create_connection((host, port), timeout=timeout_s):
                return Answer.ACCEPTED
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect((host, port))
            return Answer.ACCEPTED
    except ConnectionRefusedError:
        return Answer.REFUSED
    except OSError:
        return Answer.SILENT


class HostProbe:
    """A thread that starts a probe of one address every :data:`PROBE_EVERY_S`, each on
    a pool's thread (at most :data:`IN_FLIGHT` out at once), and keeps the run of equal
    answers in the order the probes started; :attr:`silent` and :attr:`refused` say
    that the last :data:`FAILURES` probes in a row got that answer, and `wake` is called
    when a run of either reaches it, so the daemon's loop acts on it at once."""

    def __init__(
        self, wake: Callable[[], None], probe: Callable[[str, int], Answer] = connect
    ) -> None:
        self._wake, self._probe = wake, probe
        self._lock = threading.Lock()
        self._target: tuple[str, int] | None = None
        self._run_of: tuple[Answer, int] = (Answer.ACCEPTED, 0)  # answer, probes in a row
        self._epoch = 0  # moves with the target: answers about an old one are dropped
        self._started = 0  # probes started for this target
        self._applied = 0  # probes whose answers are counted, in the order they started
        self._early: dict[int, Answer] = {}  # answers in before an earlier probe's
        self._out = 0  # probes started and not yet answered, whatever their target
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, target: tuple[str, int] | None) -> None:
        """Probe `target` (host, port) from now on; None stops probing."""
        with self._lock:
            if target == self._target:
                return
            self._target, self._run_of = target, (Answer.ACCEPTED, 0)
            self._epoch, self._started, self._applied = self._epoch + 1, 0, 0
            self._early.clear()
        if target is not None and self._thread is None:
            self._pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="host-probe")
            self._thread = threading.Thread(target=self._loop, name="host-probe", daemon=True)
            self._thread.start()
        self._changed.set()

    @property
    def silent(self) -> bool:
        """The host gave no answer :data:`FAILURES` times in a row."""
        return self._last(Answer.SILENT)

    @property
    def refused(self) -> bool:
        """The host refused :data:`FAILURES` times in a row: it is up, nothing listens."""
        return self._last(Answer.REFUSED)

    def _last(self, answer: Answer) -> bool:
        with self._lock:
            seen, count = self._run_of
            return self._target is not None and seen == answer and count >= FAILURES

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        assert self._pool is not None
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                target, epoch, number = self._target, self._epoch, self._started
                start = target is not None and self._out < IN_FLIGHT
                self._started += start
                self._out += start
            if target is None:
                self._changed.wait()
                self._changed.clear()
                continue
            if start:
                try:
                    self._pool.submit(self._one, target, epoch, number)
                except RuntimeError:
                    return  # closed meanwhile
            self._stop.wait(max(0.0, PROBE_EVERY_S - (time.monotonic() - started)))

    def _one(self, target: tuple[str, int], epoch: int, number: int) -> None:
        """One probe; its answer counts once every probe started before it has counted."""
        answer = self._probe(*target)
        reached = False
        with self._lock:
            self._out -= 1
            if epoch != self._epoch:
                return  # the address moved while we probed the old one
            self._early[number] = answer
            while self._applied in self._early:
                answer = self._early.pop(self._applied)
                self._applied += 1
                seen, count = self._run_of
                self._run_of = (answer, count + 1 if answer == seen else 1)
                reached |= answer != Answer.ACCEPTED and self._run_of[1] == FAILURES
        if reached:
            self._wake()
