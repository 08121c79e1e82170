"""A leader whose host stopped answering, deposed by the nodes that watch it.

The leader key goes by itself when the leader lease lapses: 0.75-1.5 s after a
cut-off or powered-off host's last keepalive (etcd looks for expired leases every half
second), and every group waits that long. The survivors can tell sooner: a live host's
kernel answers a connection to the leader's gate at once (accepted, or refused if the
daemon is gone), whatever its load, while a host that lost power or its network
answers nothing. So a few followers, the leader's *watchers* (the first
:data:`WATCHERS` registered nodes by id, leader left out), connect to the published
lighthouse address every 0.1 s (``daemon.host_probe``). One that gets no answer
twice in a row says so in ``suspects/<node_id>`` (on its node lease,
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

from collections.abc import Iterable

from daemon.coordination import Coordinator, JobView
from daemon.host_probe import HostProbe
from daemon.leadership.lighthouse import parse_address
from trainer import logs

WATCHERS = 3  # followers that probe the leader's host (a majority of them must agree)


def watchers_of(nodes: Iterable[str], leader: str, count: int = WATCHERS) -> tuple[str, ...]:
    """The nodes that watch `leader`: the first `count` registered others, by id."""
    return tuple(sorted(n for n in nodes if n != leader)[:count])


def needed(watchers: int) -> int:
    """How many watchers must suspect the leader's host: a majority of them."""
    return watchers // 2 + 1


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

    def round(self, job: JobView | None, leading: bool) -> None:
        """While the leader key is vacant the probe stays on the address it followed, for
        the election (``takeover_due``)."""
        if leading or job is None:
            self.probe.follow(None)
            return self._clear()
        if job.leader is None:  # vacant: the election takes it from here
            return self._clear()
        watchers = watchers_of(job.nodes, job.leader)
        # Only the address published under this leader's lease is its own: a new leader
        # still starting its lighthouse is not judged by its predecessor's address.
        if self.node_id not in watchers or job.lighthouse is None:
            self.probe.follow(None)
            return self._clear()
        self.probe.follow(parse_address(job.lighthouse))
        if not self.probe.silent:
            return self._clear()
        mark = (job.leader, job.leader_epoch)
        if self.suspected != mark:
            self.coord.suspects.suspect(job.leader, job.leader_epoch)
            self.suspected = mark
            self.log.warning(
                "leader_unreachable",
                leader=job.leader,
                address=job.lighthouse,
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
