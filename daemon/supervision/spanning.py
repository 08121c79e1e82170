"""A node's part in a replica group that spans nodes: when its ranks may start, under
which generation, and when they must stop (``daemon.coordination.group_keys`` holds the
keys).

The group's first node (node rank 0) starts every generation: once every seat is held,
and no other member's record says its ranks still run (a dead member's says so until
its lease lapses), it moves the generation on and publishes its store for it. The
others start under the current generation once the store names it, and never under one
they ran before or one started for another member in their seat (the store names the
members it was started for). A node running under generation g stops its ranks when the generation
moves on or a seat changes hands (a member lost or replaced); it moves g on itself when
its own ranks failed or it saw a member go, so that the group's other nodes stop at
once. A drain leaves the generation alone: the group's ranks agree to stop together.

Only decisions live here, on values read from etcd; the supervisor acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.coordination.job_view import JobView
from daemon.ranks.spec import GroupPart, Seat


@dataclass(frozen=True)
class Running:
    """The generation this node's ranks run under, and who held each seat then."""

    generation: int
    members: tuple[str, ...]


def members(job: JobView, gid: int) -> tuple[str, ...]:
    """The node ids in group `gid`'s seats, by node rank ("" where a seat is free)."""
    held = job.seats.get(gid, {})
    return tuple(held.get(r, "") for r in range(max(held, default=-1) + 1))


class SpanningGroup:
    def __init__(self, nodes_per_group: int) -> None:
        self.nodes = nodes_per_group
        self.running: Running | None = None
        self.last_generation = 0  # the newest generation this node's ranks ran under

    def missing(self, job: JobView, gid: int, node_rank: int) -> str | None:
        """What this node's part waits for (None: start it): every seat held and, on a
        node other than the first, the first node's store for a generation not run here."""
        held = job.seats.get(gid, {})
        if len(held) < self.nodes:
            return (
                f"the nodes of replica group {gid}: {len(held)} of "
                f"job.nodes_per_group={self.nodes} seats held"
            )
        member = self._awaited(job, gid, node_rank)
        if member is None:
            return None
        rank, node = member
        if node_rank == 0:
            ran = (job.nodes.get(node) or {}).get("generation")
            return f"{node} (node rank {rank}) to stop its ranks of generation {ran}"
        return f"replica group {gid}'s first node ({node}) to start its ranks"

    def blocker(self, job: JobView, gid: int, node_rank: int) -> tuple[int, str] | None:
        """The seated member (node rank, node id) this node's part waits on, once its ranks
        ran and failed here: a member that died with its lease still running holds its
        seat until the lease lapses, and is asked for a sign of life instead (seat_probe.py).
        None before this node's first generation or when no member holds it up."""
        if self.last_generation == 0 or len(job.seats.get(gid, {})) < self.nodes:
            return None
        return self._awaited(job, gid, node_rank)

    def _awaited(self, job: JobView, gid: int, node_rank: int) -> tuple[int, str] | None:
        held = job.seats.get(gid, {})
        if node_rank == 0:  # a member still running an ended generation (or dead, its
            # lease not lapsed yet) would leave the next one waiting on it
            for rank, node in sorted(held.items()):
                record = job.nodes.get(node) or {}
                if rank > 0 and record.get("generation") is not None:
                    return rank, node
            return None
        generation = job.generations.get(gid, 0)
        store = job.stores.get(gid) or {}
        if store.get("generation") != generation or generation <= self.last_generation:
            return 0, held.get(0, "-")
        # A store started for the members before us (a spare that took a lost member's
        # seat while the first node's ranks still ran its generation) is not ours to join.
        started_for = store.get("members")
        if not isinstance(started_for, list):  # a store from before stores named them
            return None
        if node_rank < len(started_for) and started_for[node_rank] != held.get(node_rank):
            return 0, held.get(0, "-")
        return None

    def joined(self, job: JobView, gid: int, node_rank: int) -> GroupPart | None:
        """This (non-first) node's part in the generation the store names; None when the
        store's record is not one a start can use."""
        store = job.stores.get(gid) or {}
        addr, port, generation = store.get("addr"), store.get("port"), store.get("generation")
        if not (isinstance(addr, str) and isinstance(port, int) and isinstance(generation, int)):
            return None
        uuid = store.get("replica_uuid")
        seat = Seat(node_rank, self.nodes, addr)
        return GroupPart(seat, generation, port, uuid if isinstance(uuid, str) else "")

    def started(self, job: JobView, gid: int, generation: int) -> None:
        self.running = Running(generation, members(job, gid))
        self.last_generation = max(self.last_generation, generation)

    def stopped(self) -> int | None:
        """The ranks are stopping: the generation they ran under (to move on from)."""
        running, self.running = self.running, None
        return running.generation if running is not None else None

    def must_stop(self, job: JobView, gid: int) -> str | None:
        """Why this node's ranks must stop now (None: they may go on)."""
        running = self.running
        if running is None:
            return None
        now = job.generations.get(gid, 0)
        if now > running.generation:  # (a view older than our own start reads lower)
            return f"replica group {gid} moved on to generation {now}"
        seated = members(job, gid)
        if seated != running.members:
            gone = [n for n in running.members if n not in seated]
            return f"replica group {gid} lost {', '.join(gone) or 'a member'}"
        return None
