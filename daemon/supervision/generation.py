"""A spanning group's next generation, as this node's part in it (spanning.py decides
when; this starts it through the upkeep's verbs)."""

from __future__ import annotations

from daemon.children import free_port
from daemon.config import DaemonConfig
from daemon.coordination.job_view import JobView
from daemon.ranks.spec import GroupPart, Seat
from daemon.supervision.parts import Ranks, Upkeep
from daemon.supervision.spanning import SpanningGroup, members


def next_part(
    spanning: SpanningGroup,
    job: JobView,
    seat: tuple[int, int],
    cfg: DaemonConfig,
    ranks: Ranks,
    upkeep: Upkeep,
) -> GroupPart | None:
    """This node's part in the next generation of its group (`seat`: group id, node rank):
    the first node moves the generation on and publishes its store, the others join the
    one the store names. None when etcd is away or another node moved first (look again
    next round)."""
    gid, rank = seat
    if rank > 0:
        return spanning.joined(job, gid, rank)
    seen = job.generations.get(gid, 0)
    port, uuid = free_port(cfg.bind_host), ranks.next_replica_uuid()
    # The members it starts for: a node that took a seat since joins only a later one.
    store = {"generation": seen + 1, "addr": cfg.advertise_host, "port": port}
    store["members"] = list(members(job, gid))
    if not upkeep.start_generation(gid, seen, {**store, "replica_uuid": uuid}):
        return None
    return GroupPart(Seat(0, spanning.nodes), seen + 1, port, uuid)
