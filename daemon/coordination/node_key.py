"""Putting a node's record, ``nodes/<node_id>``, so that one node id is one daemon process.

An update of the record this process last put on the same lease is one compare-and-put
on its value. Otherwise the record is created, or taken over from this process's
predecessor (``Identity.succeeds``); a record of any other instance raises
:class:`NodeIdHeld`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn

from daemon.coordination.etcd_client import CoordinationError, NodeIdHeld
from daemon.coordination.identity import Identity
from daemon.coordination.job_view import json_dict

Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]


def put_record(
    do_txn: Txn, key: str, value: str, lease: int, last: tuple[int, str] | None, me: Identity
) -> None:
    """Put `value` at `key` on `lease`; `last`: (lease, value) as this process last put it."""
    if last is not None and last[0] == lease:  # an update: one request, not two
        ok, _ = do_txn([txn.Value(key) == last[1]], [txn.Put(key, value, lease)], [])
        if ok:
            return
    ok, responses = do_txn([txn.Create(key) == 0], [txn.Put(key, value, lease)], [txn.Get(key)])
    if ok:
        return
    if responses[0]:
        current, meta = responses[0][0]
        held = json_dict(current)
        if not me.succeeds(held.get("instance")):
            raise NodeIdHeld(me.node_id, held)
        ok, _ = do_txn([txn.Mod(key) == meta.mod_revision], [txn.Put(key, value, lease)], [])
        if ok:
            return
    raise CoordinationError(f"the record of node '{me.node_id}' keeps changing; try again.")
