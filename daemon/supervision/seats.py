"""This node's slot, or its seat where groups span nodes, in etcd: the claim, the claim
again after a new session, and a spanning group's generation and store
(``daemon.coordination.group_keys``). Part of the etcd upkeep (upkeep.py), through its
:class:`~daemon.supervision.attempts.Attempts`: no coordination error leaves here.

A slot is the seat number gid x ``job.nodes_per_group`` + node rank (the group's id
where a group is one node); ``run_dir/slot`` remembers it across the daemon's lives so
the group keeps its data shard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.config import DaemonConfig
from daemon.coordination import Coordinator, JobView
from daemon.host_probe import HostProbe
from daemon.supervision.attempts import Attempts
from daemon.supervision.seat_probe import Asking, SeatProbe
from trainer import logs

__all__ = ["Asking", "Seats", "status_address"]


class Seats:
    def __init__(
        self,
        cfg: DaemonConfig,
        coord: Coordinator,
        attempt: Attempts,
        run_dir: Path,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        self.coord = coord
        self.slot: int | None = None  # the group's id (GROUP_ID); None without a seat
        self.node_rank = 0  # the seat within a group that spans nodes (GROUP_RANK)
        self.spare = False  # the last claim found every slot (seat) held
        self._attempt = attempt
        self.log = logs.get()
        self.nodes = cfg.job.nodes_per_group
        self.slot_file = run_dir / "slot"
        self._all_taken: object = None  # the slots and seats when none was free
        self._probe = SeatProbe(coord, attempt, self.nodes)
        self._wake = wake  # the daemon's loop looks at once when a member goes unheard
        self._watched: dict[str, HostProbe] = {}  # the members' status ports (watch)

    @property
    def seat(self) -> int | None:
        """The seat's number (the slot's where a group is one node), None without one."""
        return None if self.slot is None else self.slot * self.nodes + self.node_rank

    def claim(self, job: JobView | None) -> int | None:
        """Claim a slot (None: all taken, or etcd away), the one held last asked for first,
        even from a previous life. A node that found every slot taken (a spare) claims
        again only once the job's slots changed, as its watch shows, not every round."""
        if not self._attempt.due():
            return None
        taken = (job.groups, job.seats) if job is not None else None
        if taken is not None and taken == self._all_taken:
            return None
        remembered = self.slot_file.read_text().strip() if self.slot_file.exists() else ""
        preferred = self.seat
        if preferred is None and remembered.isdigit():
            preferred = int(remembered)
        ok, seat = self._attempt("claim", lambda: self._claim(preferred))
        self._all_taken = taken if ok and seat is None else None
        self.spare = ok and seat is None
        if seat is not None:
            self.slot, self.node_rank = divmod(seat, self.nodes)
            self.slot_file.write_text(f"{seat}\n")
            logs.bind(replica_group=self.slot)
            fields = {"node_rank": self.node_rank} if self.nodes > 1 else {}
            self.log.info("slot_claimed", slot=self.slot, **fields)
        return seat

    def reclaim(self) -> bool | None:
        """After a new session: claim the slot held before again. True: kept (or none was
        held); False: lost to another node; None: etcd away."""
        held = self.seat
        if held is None:
            return True
        ok, seat = self._attempt("reclaim", lambda: self._claim(held))
        if not ok:
            return None
        if seat == held:
            self.log.info("slot_reclaimed", slot=self.slot)
            return True
        self.log.warning("slot_lost", previous=self.slot, seat=held, now=seat)
        self.slot, self.node_rank = divmod(seat, self.nodes) if seat is not None else (None, 0)
        return False

    def release(self) -> None:
        """Give the slot back (raises the coordinator's errors: the caller's attempt)."""
        if self.seat is not None:
            self.coord.release_slot(self.seat, self.nodes)

    def give_back(self) -> bool:
        """Give the seat back now, as an unhealthy node does (health_gate.py); the slot
        file still names it, so it is asked for first once the node is healthy. False
        when etcd is away (the seat is still held: try again next round)."""
        held, slot = self.seat, self.slot
        if held is None:
            return True
        ok, _ = self._attempt("give_back", self.release)
        if ok:
            self.slot, self.node_rank = None, 0
            self.log.warning("seat_given_back", slot=slot, seat=held, why="unhealthy")
        return ok

    def probe(self, job: JobView, member: tuple[int, str]) -> None:
        """The seated member (node rank, node id) our group waits on is asked for a sign of
        life; its seat is revoked when it gives none (seat_probe.py)."""
        gid = self.slot
        if gid is None:
            return
        rank, node = member
        token = ("generation", job.generations.get(gid, 0))
        self._probe.check(node, gid * self.nodes + rank, token, status_address(job, node))

    def probe_members(self, job: JobView, silence: float, gone: tuple[str, ...] = ()) -> Asking:
        """Our running ranks have been still since `silence` (monotonic; a member dead
        without a word leaves them blocked in a collective or the quorum), or a member's
        status port went silent: every other seated member of the group is asked for a
        sign of life, once per silence; and members whose status port refused (`gone`,
        :meth:`watch`: no daemon there) lose their seat in this round, once per
        generation. What the round came to: the asks put out, still out, or revoked."""
        gid = self.slot
        if gid is None:
            return Asking()
        began: list[str] = []
        revoked = waiting = False
        generation = ("gone", job.generations.get(gid, 0))
        for rank, node in sorted(job.seats.get(gid, {}).items()):
            if node == self.cfg.node_id:
                continue
            seat, address, dead = gid * self.nodes + rank, status_address(job, node), node in gone
            token = generation if dead else ("silence", silence)
            fresh = self._probe.token(node, seat) != token
            revoked |= self._probe.check(node, seat, token, address, unheard=dead)
            pending = self._probe.pending(node, seat)
            waiting |= pending
            if fresh and pending:
                began.append(node)
        return Asking(tuple(began), waiting, revoked)

    def watch(self, job: JobView | None) -> None:
        """While our ranks run (`job`; None stops it), connect to the status port of
        every other member of our spanning group every 0.1 s (daemon.host_probe): a
        member whose daemon died (refused: :meth:`gone`) or whose host answers nothing
        (:meth:`silent`) leaves our ranks blocked without a word, and the other groups
        with them, until they go still."""
        gid, members = self.slot, {}
        if job is not None and gid is not None:
            seated = job.seats.get(gid, {}).values()
            members = {n: status_address(job, n) for n in seated if n != self.cfg.node_id}
        for node in [n for n in self._watched if n not in members]:
            self._watched.pop(node).close()
        for node, address in members.items():
            if node not in self._watched:
                self._watched[node] = HostProbe(self._wake)
            self._watched[node].follow(address)

    def gone(self) -> tuple[str, ...]:
        """The watched members whose status port refused twice in a row: no daemon."""
        return tuple(sorted(n for n, probe in self._watched.items() if probe.refused))

    def silent(self) -> tuple[str, ...]:
        """The watched members whose host answered nothing twice in a row: lost, or cut
        from us (a split), which the ask tells apart."""
        return tuple(sorted(n for n, probe in self._watched.items() if probe.silent))

    def holds(self, job: JobView) -> bool:
        """Whether this node still holds its seat. Where the job's view shows another
        holder or none (a seat revoked while this node was out of touch), etcd itself is
        asked; a seat not ours there is let go (logged ``seat_lost``) and claimed anew.
        True while etcd cannot say."""
        held, gid = self.seat, self.slot
        if held is None or self.nodes == 1 or gid is None:
            return True
        if job.seats.get(gid, {}).get(self.node_rank) == self.cfg.node_id:
            return True
        ok, holder = self._attempt("seat", lambda: self.coord.seat_holder(held, self.nodes))
        if not ok or holder == self.cfg.node_id:
            return True
        self.log.warning("seat_lost", slot=gid, seat=held, holder=holder)
        self.slot, self.node_rank = None, 0
        return False

    def close(self) -> None:
        self._probe.close()
        self.watch(None)

    def bump_generation(self, gid: int, seen: int) -> int | None:
        """Move a spanning group's generation on from `seen`; the one now (None: etcd away)."""
        ok, now = self._attempt("generation", lambda: self.coord.bump_generation(gid, seen))
        return now if ok else None

    def publish_store(self, gid: int, record: dict[str, Any]) -> bool:
        """Put the group's store for one generation; False when etcd is away."""
        ok, _ = self._attempt("store", lambda: self.coord.publish_store(gid, record))
        return ok

    def _claim(self, preferred: int | None) -> int | None:
        return self.coord.claim_slot(self.cfg.job.max_replicas, preferred, self.nodes)


def status_address(job: JobView, node: str) -> tuple[str, int] | None:
    """(host, status port) of `node`'s daemon as its record gives them; None without."""
    record = job.nodes.get(node, {})
    host, port = record.get("host"), record.get("http_port")
    if isinstance(host, str) and host and isinstance(port, int) and port > 0:
        return host, port
    return None
