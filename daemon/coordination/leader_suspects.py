"""The keys of a leader whose host stopped answering its watchers
(``daemon.leadership.unreachable``): ``suspects/<node_id>``, each on its writer's node
lease, and the transaction that deletes the leader key when a majority agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daemon.coordination.job_view import dump
from daemon.coordination.slots import Txn, revoke_held

PREFIX = "suspects/"


class LeaderSuspects:
    """This node's suspicion of the leader, and the deposing transaction."""

    def __init__(
        self,
        call: Callable[[Callable[[Any], Any]], Any],
        txn: Txn,
        key: Callable[[str], str],
        lease: Callable[[], int],
        node_id: str,
    ) -> None:
        self._call, self._txn, self._key, self._lease = call, txn, key, lease
        self._mine = key(PREFIX + node_id)

    def suspect(self, leader: str, epoch: int | None) -> None:
        """Put ``suspects/<us>``: the host of `leader` (under `epoch`) gives no answer."""
        value, lease = dump({"leader": leader, "epoch": epoch}), self._lease()
        self._call(lambda c: c.put(self._mine, value, lease=lease))

    def clear(self) -> None:
        self._call(lambda c: c.delete(self._mine))

    def depose(self, leader: str) -> bool:
        """Delete the ``leader`` key (and ``lighthouse`` and ``lost``, on its lease) if
        `leader` still holds it; True if this call deleted it."""
        key = self._key("leader")
        raw, _ = self._call(lambda c: c.get(key))
        also = (self._key("lighthouse"), self._key("lost"))
        return revoke_held(self._txn, key, None if raw is None else bytes(raw), leader, also)
