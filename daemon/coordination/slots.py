"""Replica-group slots, ``groups/<gid>``: which free one a joining node tries, and the claim.

Every joiner used to try the lowest free slot first: with many joining at once all
but one lost each round, about N/2 transactions per node in a mass join. A node now
tries its remembered slot first, then one of the lowest *k* free slots chosen by a
hash of its node id and the attempt, where *k* is the number of registered nodes
that hold no slot (the joiners competing now, counted by one count-only read), so
joiners spread over as many slots as there are joiners and the slots stay the
lowest ones. A lone joiner (k = 1) takes the lowest free slot, as before. A lost
race returns the slots held now in the same transaction, and the node picks again
among as many of the lowest free slots as joiners remain (those who won since count
no more), so a retry never leaves a lower slot empty.

Where a replica group spans several nodes (``job.nodes_per_group`` > 1) the same claim
takes a *seat*, ``seats/<gid>/<node rank>``: seats are numbered group by group
(seat = gid x nodes_per_group + node rank), so joiners fill the lowest groups whole
before the next, and a node that finds no free seat waits as a spare.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn
from pyetcd.utils import prefix_range_end

from daemon.coordination.identity import holder_of
from daemon.coordination.records import key_text

Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]


def pick(free: list[int], joiners: int, node_id: str, attempt: int) -> int:
    """One of the lowest ``joiners`` slots in ``free`` (ascending), by a hash of the node
    id and the attempt."""
    k = max(1, min(len(free), joiners))
    digest = hashlib.sha256(f"{node_id}/{attempt}".encode()).digest()
    return free[int.from_bytes(digest[:8], "big") % k]


def slot_prefix(nodes_per_group: int) -> str:
    """The key prefix (below the job's) of the slots: one per group, or one per seat."""
    return "groups/" if nodes_per_group == 1 else "seats/"


def slot_suffix(slot: int, nodes_per_group: int) -> str:
    """The key of slot (or seat) `slot` below :func:`slot_prefix`."""
    if nodes_per_group == 1:
        return str(slot)
    return f"{slot // nodes_per_group}/{slot % nodes_per_group}"


def slot_of(suffix: str, nodes_per_group: int) -> int | None:
    """The slot (or seat) a key below :func:`slot_prefix` names; None for any other key."""
    if nodes_per_group == 1:
        return int(suffix) if suffix.isdigit() else None
    gid, _, rank = suffix.partition("/")
    if not (gid.isdigit() and rank.isdigit() and int(rank) < nodes_per_group):
        return None
    return int(gid) * nodes_per_group + int(rank)


def seat_key(seat: int, nodes_per_group: int) -> str:
    """The key (below the job's prefix) of slot or seat `seat`."""
    return slot_prefix(nodes_per_group) + slot_suffix(seat, nodes_per_group)


def rebind(do_txn: Txn, key: str, kv: Any, me: str, lease: int) -> bool:
    """Keep a slot key this node already holds (`kv`, as read), moving it to this process
    and lease if needed. A key can outlive the process that wrote it (a restarted
    daemon's predecessor, on the same run directory); left on that process's lease it
    would vanish later without notice."""
    if kv.lease == lease and bytes(kv.value) == me.encode():
        return True
    ok, _ = do_txn([txn.Mod(key) == kv.mod_revision], [txn.Put(key, me, lease)], [])
    return ok


def revoke_held(
    do_txn: Txn, key: str, value: bytes | None, member: str, also: tuple[str, ...] = ()
) -> bool:
    """Delete the seat at `key` (its value `value`, as read), and the keys `also`, if
    `member` still holds it, compared on the value (``daemon.supervision.seat_probe``: a
    member that gave no sign of life; ``leader_suspects``: a leader its watchers could not
    reach); False when it does not (it left, or another holds it)."""
    if value is None or holder_of(value)[0] != member:
        return False
    gone = [txn.Delete(k) for k in (key, *also)]
    ok, _ = do_txn([txn.Value(key) == bytes(value)], gone, [])
    return ok


def held_slots(prefix: str, kvs: list[Any], nodes_per_group: int = 1) -> dict[int, Any]:
    """Slot number -> its key-value (or (value, metadata) from a transaction's range)."""
    held: dict[int, Any] = {}
    for kv in kvs:
        key = kv[1].key if isinstance(kv, tuple) else kv.key
        slot = slot_of((key_text(key) or "")[len(prefix) :], nodes_per_group)
        if slot is not None:
            held[slot] = kv
    return held


def value_of(kv: Any) -> bytes:
    return bytes(kv[0] if isinstance(kv, tuple) else kv.value)


def mine(held: dict[int, Any], node_id: str, max_replicas: int) -> int | None:
    """The lowest slot below ``max_replicas`` that this node id holds (this process or its
    predecessor), if any."""
    found = sorted(
        g for g, kv in held.items() if holder_of(value_of(kv))[0] == node_id and g < max_replicas
    )
    return found[0] if found else None


def claim_free(
    do_txn: Txn,
    prefix: str,
    held: dict[int, Any],
    me: str,
    lease: int,
    *,
    node_id: str,
    max_replicas: int,
    preferred: int | None,
    joiners: int,
    nodes_per_group: int = 1,
) -> int | None:
    """Create one free ``<prefix><gid>`` (or seat) for this node (value `me`, on `lease`);
    None when every one is taken. `max_replicas` counts slots: seats where groups span
    nodes."""
    end = prefix_range_end(prefix.encode())
    for attempt in range(max_replicas + 1):
        free = [g for g in range(max_replicas) if g not in held]
        if not free:
            return None
        if attempt == 0 and preferred in free:
            gid = preferred
        else:
            gid = pick(free, joiners, node_id, attempt)
        key = prefix + slot_suffix(gid, nodes_per_group)
        ok, responses = do_txn(
            [txn.Create(key) == 0], [txn.Put(key, me, lease)], [txn.Get(prefix, end)]
        )
        if ok:
            return gid
        now = held_slots(prefix, list(responses[0]), nodes_per_group)
        # Those who won since were joiners too: the rest compete for fewer slots, and
        # picking among the lowest `joiners` free ones still would skip a lower slot.
        joiners = max(1, joiners - max(0, len(now) - len(held)))
        held = now
    return None
