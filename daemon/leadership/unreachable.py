"""A leader whose host stopped answering, deposed by the nodes that watch it.

The leader key goes by itself when the leader lease lapses: 0.75-1.5 s after a
cut-off or powered-off host's last keepalive (etcd looks for expired leases every half
second), and every group waits that long. The survivors can tell sooner: a live host's
kernel answers a connection to the leader's gate at once (accepted, or refused if the
daemon is gone), whatever its load, while a host that lost power or its network
answers nothing. So a few followers, the leader's *watchers* (the first
:data:`WATCHERS` registered nodes by id, leader left out), connect to the published
lighthouse address every :data:`PROBE_EVERY_S`. One that gets no answer
:data:`FAILURES` times in a row says so in ``suspects/<node_id>`` (on its node lease,
with the leader's node and epoch), and the watcher that finds a majority of the
watchers agreeing deletes the leader key, if it still holds that leader (one
transaction, ``daemon.coordination.leader_suspects``). The followers then campaign as
after any vacancy (``election.py``), without probing the gate again.

A frozen leader daemon, or one that is slow, still has a kernel that answers: it is
left to its lease. A watcher cut off alone gets no majority (and reaches no etcd). A
leader deposed while it could still reach etcd sees another node take the key and
restarts its ranks (``daemon.fencing.judge``), as after a lapsed lease. Nothing is
written while the leader answers: a steady job costs etcd nothing more.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable

from daemon.coordination import Coordinator, JobView
from daemon.leadership.lighthouse import parse_address
from trainer import logs

WATCHERS = 3  # followers that probe the leader's host (a majority of them must agree)
PROBE_EVERY_S = 0.25
CONNECT_S = 0.25  # a live kernel answers a connection in well under a millisecond
FAILURES = 2  # probes in a row without an answer before a watcher suspects the host


def watchers_of(nodes: Iterable[str], leader: str, count: int = WATCHERS) -> tuple[str, ...]:
    """The nodes that watch `leader`: the first `count` registered others, by id."""
    return tuple(sorted(n for n in nodes if n != leader)[:count])


def needed(watchers: int) -> int:
    """How many watchers must suspect the leader's host: a majority of them."""
    return watchers // 2 + 1


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

    def follow(self, address: str | None) -> None:
        """Probe `address` (host:port) from now on; None stops probing."""
        target = parse_address(address) if address else None
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


class UnreachableLeader:
    """Each round (``Leadership.update``): probe the leader's host if this node watches
    it, say so in etcd when it stopped answering, and depose it once a majority of its
    watchers agree."""

    def __init__(self, node_id: str, coord: Coordinator, probe: HostProbe) -> None:
        self.node_id, self.coord, self.probe = node_id, coord, probe
        self.suspected: tuple[str, int | None] | None = None  # (leader, epoch) we wrote
        self.log = logs.get()

    @property
    def silent(self) -> bool:
        """The host of the lighthouse last probed gave no answer (:data:`FAILURES` times)."""
        return self.probe.silent

    def round(self, job: JobView | None, lighthouse: str | None, leading: bool) -> None:
        """`lighthouse`: the address last published (kept while the key is absent)."""
        if leading or job is None:
            self.probe.follow(None)
            return self._clear()
        if job.leader is None:  # vacant: the election takes it from here
            return self._clear()
        watchers = watchers_of(job.nodes, job.leader)
        if self.node_id not in watchers:
            self.probe.follow(None)
            return self._clear()
        self.probe.follow(job.lighthouse or lighthouse)
        if not self.probe.silent:
            return self._clear()
        mark = (job.leader, job.leader_epoch)
        if self.suspected != mark:
            self.coord.suspects.suspect(job.leader, job.leader_epoch)
            self.suspected = mark
            self.log.warning(
                "leader_unreachable",
                leader=job.leader,
                address=job.lighthouse or lighthouse,
                watchers=list(watchers),
            )
        agree = [
            n
            for n in watchers
            if n == self.node_id or _says(job.suspects.get(n), job.leader, job.leader_epoch)
        ]
        if len(agree) >= needed(len(watchers)) and self.coord.suspects.depose(job.leader):
            self.log.warning(
                "leader_deposed",
                leader=job.leader,
                suspects=agree,
                reason="its host stopped answering",
            )

    def _clear(self) -> None:
        if self.suspected is not None:
            self.coord.suspects.clear()
            self.suspected = None

    def close(self) -> None:
        self.probe.close()


def _says(value: object, leader: str, epoch: int | None) -> bool:
    """Whether a ``suspects/<node>`` value suspects this leader under this epoch."""
    return isinstance(value, dict) and value.get("leader") == leader and value.get("epoch") == epoch
