"""``checkpoints/latest``: the job's newest complete checkpoint, as the daemons publish it.

A writer group's rank 0 records each complete save; its daemon publishes it here from
its main loop. The key only moves forward: a record of an older or the same step than
the one there is dropped, whoever sends it (a slow publication, a group back from a
fence). A daemon back from a fence reads it (``fencing.job_moved_on``) to learn whether
the job went on without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn

from daemon.coordination.etcd_client import CoordinationError
from daemon.coordination.job_view import dump, json_dict

Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]


def publish_latest(do_txn: Txn, key: str, record: dict[str, Any]) -> None:
    """Put `record` at `key` unless it already names the same or a newer step.
    `do_txn` is the coordinator's."""
    step = record["step"]
    if not isinstance(step, int):
        raise ValueError(f"checkpoint record needs an int 'step', got {step!r}")
    value = dump(record)
    for _ in range(10):
        ok, responses = do_txn([txn.Create(key) == 0], [txn.Put(key, value)], [txn.Get(key)])
        if ok or not responses[0]:
            return
        current, meta = responses[0][0]
        if json_dict(current).get("step", -1) >= step:
            return
        ok, _ = do_txn([txn.Mod(key) == meta.mod_revision], [txn.Put(key, value)], [])
        if ok:
            return
    raise CoordinationError("checkpoints/latest keeps changing; try again.")
