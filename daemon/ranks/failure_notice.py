"""A node's word that its own group's ranks failed: every other group hears it at once.

torchft links rank r of every group in one ring (gloo's all-reduce). When a rank dies,
only its two ring neighbours see the connection close; they give the step up, but keep
their ends of the ring open, so a group further round stays blocked on a neighbour that
has already left. The next quorum then waits for that blocked group, alive and
heartbeating, until ``lighthouse.join_timeout_ms`` (10 s by default): with three or
more groups, half the ring positions of a failure used to cost the whole job that long.

The daemon of the failed group sees its rank exit (or kills a hung one) first. It reads
the quorum its ranks were in from their heartbeats (``trainer.contracts.heartbeat``), and puts
``failed/<gid>`` in etcd (on its node lease): the group's torchft replica id, that
quorum's id and the lighthouse that numbered it. Every daemon's watch sees the put and
tells its ranks (``daemon.supervision.rank_notice``, ``PHALANX_NOTICE``), and a rank
whose own quorum is that one abandons the collective it waits on, within a poll of
the notice file (50 ms), as it does for the leader's ``lost`` announcements. A rank
already past that quorum (the replacement's first quorum is numbered anew) ignores it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from daemon.ranks.workers import ExitKind
from trainer.config.env import replica_id
from trainer.contracts.heartbeat import read_beat

# Outcomes of a group whose ranks may have left peers inside a collective: a rank that
# exited with an error or a signal, or a group the daemon killed as hung. A completed,
# drained or quorum-less group left no collective behind.
ANNOUNCED = (ExitKind.FAILED, ExitKind.HUNG)


def failure_word(
    kind: ExitKind, slot: int, replica_uuid: str, heartbeats: list[Path], lighthouse: str | None
) -> dict[str, Any] | None:
    """The ``failed/<slot>`` value for a group that ended with `kind`, its ranks' heartbeat
    files `heartbeats`; None when there is nothing to announce (another kind of end, no
    lighthouse, no rank that had a quorum yet). The quorum is the one most of its ranks
    last named (they share their group rank 0's quorums; a rank may lag it briefly)."""
    if kind not in ANNOUNCED or not lighthouse or not replica_uuid:
        return None  # without the daemon's uuid, torchft named the replica: nothing to match
    named = [q for q in (read_beat(h).quorum_id for h in heartbeats) if q is not None]
    if not named:
        return None
    quorum_id = Counter(named).most_common(1)[0][0]
    return {
        "replicas": [f"{replica_id(slot)}:{replica_uuid}"],
        "quorum_id": quorum_id,
        "lighthouse": lighthouse,
        "at": time.time_ns(),
    }
